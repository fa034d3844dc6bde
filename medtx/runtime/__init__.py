"""The machine a command runs on: how many cores a training may use (`resources`), stopping every process a
command started (`processes`) and the process pool that trains several models at once (`train_processes`)."""
