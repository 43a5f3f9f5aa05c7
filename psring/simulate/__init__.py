"""``psring simulate``: runs replayed on a flow-level network model, at sizes no machine here has
(``network``: links and max-min fair sharing; ``programs``: each strategy's step from its own planners;
``vector``: the flat ring for thousands of workers; ``run``: the steps, jitter and the run folder;
``validate``: every committed run it replays, against what it measured; ``cli``: the command)."""
