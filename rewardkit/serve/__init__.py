"""The reward server and its client: ``rewardkit serve`` and :class:`~rewardkit.serve.client.RemoteReward`.

One module per concern, top to bottom (``.importlinter`` holds the order; docs/architecture.md explains it):

- :mod:`~rewardkit.serve.client`: ``RemoteReward``, a served reward used as a local ``Reward``;
- :mod:`~rewardkit.serve.server`: the Starlette app, its handlers and the uvicorn helpers;
- :mod:`~rewardkit.serve.batch`: the dynamic batcher (a queue and a worker per replica) and the open connections;
- :mod:`~rewardkit.serve.net`: connection handling (the connection cap, read deadlines, Nagle off);
- :mod:`~rewardkit.serve.secrets`: credentials redacted from every answer and log record;
- :mod:`~rewardkit.serve.wire`: the JSON request body; :mod:`~rewardkit.serve.binary`: the binary one;
- :mod:`~rewardkit.serve.checks`: what both bodies check before reading (``HTTPError``, JSON bounds, raw
  image shapes and pixel limits); :mod:`~rewardkit.serve.config`: ``ServerConfig``, the limits.

The folder knows the contract (:class:`rewardkit.Reward` and its inputs and outputs), never the rewards: it
serves the ``Reward`` objects it is given. Loading a reward by its registry name (``load_replicas``,
``app_from_env``) is :mod:`rewardkit.server`'s, the public module above the registry, which re-exports this
folder's server API; :mod:`rewardkit.client` re-exports the client. Nothing is imported here: ``import
rewardkit.serve`` stays light.
"""
