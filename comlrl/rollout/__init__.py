"""Rollouts: a team's completions for a batch of prompts, and the episode tree they grow into.

One member of a team (:mod:`.agent`); the multi-turn episode: rollout tree, team rewards, per-agent advantages
(:mod:`.episode`); who sees whose answer at each stage of a turn, and the prompts that follow (:mod:`.topology`); a
later turn's prompts from the user's external transition (:mod:`.transition`); batched generation for one agent:
tokenized, left-padded prompts in, masked completions out (:mod:`.rollout`); what a rollout engine takes and returns
(:mod:`.protocol`) and the one place that picks the engine (:mod:`.generation`: comlrl's decode loop, transformers'
``generate``, vLLM); the vLLM engines themselves, colocated (:mod:`.vllm_engine`) or a server (:mod:`.vllm_server`);
per-row sampling streams (:mod:`.sampling`).

What may live here: sampling completions and scoring them into an episode. What may not: a training loop or an
optimizer step (:mod:`comlrl.trainers`, which calls this package), or speed tricks other than through the engines.
"""
