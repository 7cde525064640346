"""Building and running a plan: the :class:`~flowrl.engine.trainer.Trainer`, its state, restore checks,
the evaluation driver, the dry plan and the Ray runtime."""
