"""The pipeline without Prefect: its YAML config (`config`) and the checks at load (`checks`), the plan of steps
(`plan`), what each step kind does (`steps`), the scheduler that runs the plan (`executor`), run bookkeeping in
ml.pipeline_* (`runs`), progress and ETA (`progress`), the order trainings start in (`order`) and the folder of
training/result packages the workers exchange (`exchange`). `flows/` wraps these in Prefect."""
