"""The reference library's API (PyPI ``comlrl`` 1.4.3, arXiv 2508.04652) as a migration surface, onto ours.

Scripts written for it run here unchanged: its import paths are thin modules re-exporting our classes
(:mod:`comlrl.trainers.reinforce`, :mod:`comlrl.trainers.preference`, :mod:`comlrl.trainers.actor_critic`,
:mod:`comlrl.utils`), its config fields are translated onto ours with the reference's meaning
(:mod:`.fields`) and its trainer keywords onto our trainer's (:mod:`.keywords`). There is one implementation: a
reference name only ever builds our config or trainer. Each translation logs one line on its first use, naming the
reference field and what it became here. docs/migration.md lists them side by side.
"""

REFERENCE = "comlrl 1.4.3"
