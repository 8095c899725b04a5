"""Scale-out: torchrun's process group and launching (:mod:`.distributed`), where agents live and how rows and
gradients split (:mod:`.placement`), this process's part of a job (:mod:`.job`), FSDP2 sharding of an agent over its
ranks (:mod:`.sharding`) and crash-safe checkpoints (:mod:`.checkpoint`).

What may not live here: a trainer. The loop hands this package what it needs (checked by import-linter).
"""
