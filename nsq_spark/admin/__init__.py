"""Admin clients of nsqd's and nsqlookupd's HTTP API, blocking and asyncio, on httpx:
stats (topics, channels, clients), lookups and nodes, and the operations create, delete,
empty, pause and unpause a topic or channel, tombstone a producer, ping and info.

::

    from nsq_spark.admin import NsqdClient

    with NsqdClient("127.0.0.1:4151") as nsqd:
        nsqd.pause_channel("orders", "billing")
        ...
        nsqd.unpause_channel("orders", "billing")

Layers: :mod:`.calls` (sans-IO: URLs, parsing, error answers), :mod:`.transport` (httpx
behind a typed port), :mod:`.client` (the four clients), :mod:`.model` (results),
:mod:`.errors`. The ``nsq-spark stat|topic|channel`` commands use these clients.
"""

from .client import (DEFAULT_TIMEOUT, AsyncLookupdClient, AsyncNsqdClient, LookupdClient,
                     NsqdClient)
from .errors import (AdminError, AdminTLSError, ChannelNotFoundError, HTTPStatusError, LookupdError,
                     NodeUnreachableError, NotFoundError, TopicNotFoundError,
                     UnexpectedAnswerError)
from .model import (ChannelStats, ClientStats, Lookup, LookupdInfo, LookupdProducer, NsqdInfo,
                    NsqdStats, TopicStats)

__all__ = ["AdminError", "AdminTLSError", "AsyncLookupdClient", "AsyncNsqdClient", "ChannelNotFoundError",
           "ChannelStats", "ClientStats", "DEFAULT_TIMEOUT", "HTTPStatusError", "Lookup",
           "LookupdClient", "LookupdError", "LookupdInfo", "LookupdProducer",
           "NodeUnreachableError", "NotFoundError", "NsqdClient", "NsqdInfo", "NsqdStats",
           "TopicNotFoundError", "TopicStats", "UnexpectedAnswerError"]
