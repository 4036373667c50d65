"""What training adds around a task: optimiser parameter groups and learning-rate schedules
(`optim`), and the Lightning callbacks every task gets (`callbacks`: the prediction writer,
skipped samples, exact-resume random states, EMA weights)."""
