"""Speed only, the same math: comlrl's decode loop (:mod:`.fastgen`; its token sampler :mod:`.sampler`, its decoder for
Llama-layout models :mod:`.llama_decoder` and that decoder's weight snapshots :mod:`.decode_weights`), autograd
Functions that save fewer activations (:mod:`.lean`), block attention over packed rows and the bf16 CPU attention choice
(:mod:`.attention`), packing of rows that share a prompt (:mod:`.packing`), chunked output-layer log-probs
(:mod:`.head`), shape buckets (:mod:`.shapes`) and module inspection (:mod:`.modules`).

Each piece has a test that it computes what the plain path computes. What may not live here: anything that changes
what is optimized. Nothing here imports the engine, the trainers, the algorithms or the environments; the trainers
reach it only through :mod:`comlrl.engine` (checked by import-linter).
"""
