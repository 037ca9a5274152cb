"""Admin clients of nsqd's and nsqlookupd's HTTP API, blocking and asyncio, on httpcore:
stats (topics, channels, clients), lookups and nodes, and the operations create, delete,
empty, pause and unpause a topic or channel, tombstone a producer, ping and info; and
deleting a topic or a channel from a whole cluster as nsqadmin does
(:func:`delete_topic`, :func:`delete_channel`: every lookupd's registration and every
nsqd's data).

::

    from nsq_spark.admin import NsqdClient

    with NsqdClient("127.0.0.1:4151") as nsqd:
        nsqd.pause_channel("orders", "billing")
        ...
        nsqd.unpause_channel("orders", "billing")

Layers: :mod:`.calls` (sans-IO: URLs, parsing, error answers), :mod:`.transport` (the
one place that bounds an HTTP call: a deadline for the whole request and a size limit for
its answer, behind a typed port), :mod:`.client` (the four clients), :mod:`.cluster`
(operations on the nodes of a cluster), :mod:`.model` (results), :mod:`.errors`. The
``nsq-spark stat|topic|channel`` commands use these clients.
"""

from .client import (DEFAULT_TIMEOUT, AsyncLookupdClient, AsyncNsqdClient, LookupdClient,
                     NsqdClient)
from .cluster import ClusterResult, delete_channel, delete_topic, topic_producers
from .errors import (AdminError, AdminTLSError, AnswerTooLargeError, ChannelNotFoundError,
                     HTTPDeadlineError, HTTPStatusError, LookupdError, NodeUnreachableError,
                     NotFoundError, TopicNotFoundError, UnexpectedAnswerError)
from .model import (ChannelStats, ClientStats, Lookup, LookupdInfo, LookupdProducer, NsqdInfo,
                    NsqdStats, TopicStats)

__all__ = ["AdminError", "AdminTLSError", "AnswerTooLargeError", "AsyncLookupdClient",
           "AsyncNsqdClient", "ChannelNotFoundError", "ChannelStats", "ClientStats",
           "ClusterResult", "DEFAULT_TIMEOUT", "HTTPDeadlineError", "HTTPStatusError",
           "Lookup", "LookupdClient", "LookupdError", "LookupdInfo", "LookupdProducer",
           "NodeUnreachableError", "NotFoundError", "NsqdClient", "NsqdInfo", "NsqdStats",
           "TopicNotFoundError", "TopicStats", "UnexpectedAnswerError", "delete_channel",
           "delete_topic", "topic_producers"]
