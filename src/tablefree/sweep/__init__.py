"""The sweep behind ``tablefree compare``: its config, the plan built once from it, and two executors of that
plan. The modules, lowest first:

- ``grid``: what tells runs apart (grid points, their names, "differ only in their budget"); the report
  imports it too, so it imports nothing else of the sweep.
- ``branch_record``: a branch's ``branch.json`` read back and verified against its trunk (``read_branch``); the
  report and ``--status`` read it, so it too imports nothing else of the sweep.
- ``config``: ``CompareConfig`` and ``load_compare_config``; the shared recipe (``base_recipe``).
- ``plan``: ``plan_runs`` (every run with its ``TrainConfig`` parsed once, trunks before their branches),
  ``check_plans`` (before the dataset is prepared), ``check_sweep`` (against the dataset).
- ``dataset``, ``record``: the dataset prepared and checked; ``compare.yaml``, the sweep's record of itself.
- ``branching``: a branch's start from its trunk's checkpoint and its ``branch.json``.
- ``run``: one run trained, evaluated and its status kept; ``status``: where each run stands.
- ``local``, ``slurm``: the two executors.

``tablefree.compare.run_sweep`` ties them together with the report.
"""
