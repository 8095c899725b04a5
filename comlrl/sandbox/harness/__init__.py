"""The processes the sandbox starts: the zygote, each run's init, the judge and the candidate.

``_harness.py`` is run as a script (``python -I -S``), with this folder first on ``sys.path``, so these modules
import each other as top-level modules; the ``_harness_`` prefix keeps a program's ``import judge`` from finding
one of them. The parent side (``comlrl.sandbox``) imports only ``_harness_os`` from here.
"""
