"""Human studies in the browser: a person plays the user seat against blinded policies.

``simpop study serve --env ID --policy A=SPEC --policy B=SPEC [--scenarios ...] --out DIR`` serves a local web
app (:mod:`.app`, FastAPI + uvicorn, one static page). A participant opens the link with the study token (and a
recruitment platform's ids), reads and accepts the consent page (declining keeps only a count), may answer a
short questionnaire, gets the user seat's brief as a card (``persona`` mode, P4G: the persuadee's persona and
the donation task; τ²: the customer's scenario; ``self`` mode, P4G only: the charity and the person's own bonus,
:mod:`.modes`), and chats with a policy chosen by blinded randomisation (:mod:`.study`). After the last chat the
debrief page gives a completion code (verifiable with ``simpop study verify``) and the platform's return link. The dialogue runs in the
rollout engine of training with a :class:`~.human.HumanSeat` in the user seat (:mod:`.chat`), so the env
scores it exactly as in training: a P4G decision stated in the chat, else the closing survey the person
answers; τ²'s evaluator. After each chat the person rates naturalness (1-5) and whether they would talk to
the agent again.

Every chat is saved to ``DIR/episodes.jsonl`` as ``simpop eval``'s
:class:`~simpop.evaluation.panel.EpisodeRecord` (``member`` = the pseudonymous participant id, ``trial`` = the
participant's chat number, ``simulator`` = ``human``) with ``extra["study"]``: participant, policy label and
spec (revealed only in the results), ratings, timings, effort and the platform ids' salted hashes
(:mod:`.storage`, which also keeps the participant ledger). ``simpop study report DIR`` (:mod:`.report`) writes
``summary.json``, ``report.md`` and ``success.png``: the declared primary outcome, success and ratings per
policy with intervals, the paired (within-participant) comparison, the declared exclusions and the people's
questionnaire beside the shipped personas. ``simpop study simulate`` and ``plan`` (:mod:`.plan`) size a study.

Security: the app binds 127.0.0.1 by default, needs the study token to join, limits message length, request
size and message rate, and renders chat text as text only (no HTML), under a strict Content-Security-Policy.
Nothing leaves the machine. Needs the ``study`` extra (``pip install simpop[study]``).
"""
