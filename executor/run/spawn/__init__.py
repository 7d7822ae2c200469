"""The ways a claimed task gets its `claude` process, behind one interface (`spawner.Spawner.acquire`):

- cold (`cold.py`): started now, for the task;
- warm (`warm.py`, its pool `warm_pool.py`): a thread's next turn's CLI, started before its message and waiting
  on stdin;
- ahead (`ahead.py`, its pool `ahead_pool.py`): a thread's next turn's sandbox, started before the turn's claim
  (a spare for whichever thread comes first, or its own on its message), the CLI's command line given to it then.

Every process, whichever way, is started by `launch.Launcher`; what one no run took leaves is released there too.
The pools keep their processes through what the spawn package hands them (a starter built on the launcher), never
through the runner.
"""
