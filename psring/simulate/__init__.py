"""``psring simulate``: runs replayed on a flow-level network model, at sizes no machine here has
(``network``: links and max-min fair sharing; ``programs``: each strategy's step from its own planners;
``run``: the steps, jitter and the run folder; ``cli``: the command)."""
