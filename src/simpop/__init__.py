"""simpop: train multi-turn LLM agents against populations of user simulators.

``simpop.make(env_id)`` builds a two-seat PettingZoo env (``api="aec"``: its AEC view); after ``import simpop``,
``gymnasium.make(env_id, simulator=...)`` builds the single-agent view of its policy seat.
"""

from simpop.envs import ids, make

__all__ = ["ids", "make"]
__version__ = "0.1.0"
