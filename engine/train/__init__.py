"""One training process (a rank): the loop and what it is made of. Rank-only: the ComfyUI server
never imports this package.

- loop.py: setup, resume, loop, save (`python -m engine` runs its main); model_setup.py: the model it trains;
  saving.py: the weights it saves and its checkpoints; eval_watch.py: eval, best step and early stop.
- objective.py: the training objective for every model ComfyUI loads; conditioning.py: a cached
  item's conditioning -> ComfyUI's extra_conds; sample_order.py: which samples each rank trains on.
- lora.py: LoRA layers and files (adapter_kinds.py: LoHa, LoKr, DoRA); full_tune.py: a full fine-tune's
  trained block weights and the model it saves; ema.py: the EMA copy of the LoRA weights; grad_norm.py: the
  gradient norm of each step. optim.py + optimizers/: optimizers and schedules.
- pipeline.py: pipeline + data parallel over DeepSpeed; plain.py: one process without DeepSpeed;
  distributed.py: rank helpers and collectives; node_checks.py: every node runs the same thing.
- checkpoints.py: training checkpoints and resume; checkpoint_space.py: a failed (full-disk) write.
  stop_flag.py: when to checkpoint and stop. samples.py: sample images during training.
  eval_set.py: the held-out eval loss.
"""
