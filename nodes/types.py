"""Names of PipeTrain's custom ComfyUI types, in one place so node files cannot drift apart.

Each value travels between nodes as a small frozen dataclass (paths + parameters), never a
live model, so it survives the process boundary to the engine and a ComfyUI restart.
"""
DATASET = "PIPETRAIN_DATASET"  # engine.data.scan.DatasetSpec
CACHE = "PIPETRAIN_CACHE"  # engine.cache.format.CacheSpec
LORA = "PIPETRAIN_LORA"
MEMORY = "PIPETRAIN_MEMORY"
OBJECTIVE = "PIPETRAIN_OBJECTIVE"  # engine.config.objective.ObjectiveSpec
TRAIN_OPTIONS = "PIPETRAIN_TRAIN_OPTIONS"  # nodes.train_options.TrainOptions
RUN = "PIPETRAIN_RUN"
CLUSTER = "PIPETRAIN_CLUSTER"  # engine.config.run.ClusterSpec
EXPERTS = "PIPETRAIN_EXPERTS"  # nodes.wan_experts.ExpertsSpec
