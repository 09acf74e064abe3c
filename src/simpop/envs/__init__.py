"""simpop environments: one folder per benchmark, registered by id (see :func:`ids`).

A benchmark registers its env ids here, and the native simulator kinds that spec strings can name
(:func:`simpop.seat.register_simulator_kind`; entry points are strings, so nothing is imported yet).
"""

from simpop.envs.registration import EnvSpec, ids, make, register, spec
from simpop.seat import Kind, register_simulator_kind

__all__ = ["EnvSpec", "ids", "make", "register", "spec"]

register("simpop/Persuasion-v1", "simpop.envs.persuasion.env:PersuasionEnv",
         default_simulator="simpop.envs.persuasion.simulators:native_text")
# v0 = v1 without the closing survey (an undecided dialogue truncates with reward 0): kept for comparability.
register("simpop/Persuasion-v0", "simpop.envs.persuasion.env:PersuasionEnv",
         default_simulator="simpop.envs.persuasion.simulators:native_text", survey=False)
register("simpop/PersuasionAct-v0", "simpop.envs.persuasion.env:PersuasionActEnv",
         default_simulator="simpop.envs.persuasion.simulators:native_act")
register("simpop/CooperBench-mini-v0", "simpop.envs.cooperbench.env:CooperBenchEnv",
         default_simulator="simpop.envs.cooperbench.simulators:default_teammate", dataset="mini")
register("simpop/CooperBench-v0", "simpop.envs.cooperbench.env:CooperBenchEnv",
         default_simulator="simpop.envs.cooperbench.simulators:default_teammate")
register("simpop/Tau2-mock-v0", "simpop.envs.tau2.env:Tau2Env",
         default_simulator="simpop.envs.tau2.simulators:scripted_user", domain="mock")
register("simpop/Tau2-airline-v0", "simpop.envs.tau2.env:Tau2Env",
         default_simulator="simpop.envs.tau2.simulators:scripted_user", domain="airline")
register("simpop/Tau2-retail-v0", "simpop.envs.tau2.env:Tau2Env",
         default_simulator="simpop.envs.tau2.simulators:scripted_user", domain="retail")
register("simpop/Tau2-telecom-v0", "simpop.envs.tau2.env:Tau2Env",
         default_simulator="simpop.envs.tau2.simulators:scripted_user", domain="telecom")
register("simpop/Tau2-telecom-workflow-v0", "simpop.envs.tau2.env:Tau2Env",
         default_simulator="simpop.envs.tau2.simulators:scripted_user", domain="telecom-workflow")

register_simulator_kind("persuadee", Kind(
    "simpop.envs.persuasion.simulators:from_spec",
    "the native P4G persuadee (act or text level): model base | heldout-<i> | shuffled-<i> | fitted-<i> (corpus=DIR); "
    "decoding sample | greedy",
    decoding={"decoding": "sample", "temperature": 1.0}, extra={"jitter": 0.35, "model_seed": 4242, "corpus": ""},
    needs_model=False, distribution=True,
    trainable="simpop.envs.persuasion.trainable:TrainableActPersuadee.from_spec"))
