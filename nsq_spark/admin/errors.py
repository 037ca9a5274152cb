"""Typed errors of the admin clients (:mod:`nsq_spark.admin`).

Every one derives from :class:`AdminError` (an :class:`~nsq_spark.errors.NSQError`), names
the node and what was asked, and says how to fix it. A bad topic or channel name is
refused before any request with the library's usual
:class:`~nsq_spark.errors.InvalidNameError`, and a bad address with
:class:`~nsq_spark.errors.InvalidAddressError`.

:class:`NodeUnreachableError` is also a :class:`~nsq_spark.errors.ConnectError` (so an
``OSError``), which :func:`nsq_spark.errors.is_transient` counts as worth another attempt,
as it does an :class:`HTTPStatusError` 500, 502, 503 or 504 (the server, or a proxy in
front of it, failed this time); the others are answers, and another attempt gets the same
answer.
"""

from __future__ import annotations

from nsq_spark.errors import (ConnectError, HTTPAnswerError, NSQError, NSQTimeoutError,
                              TLSError)

__all__ = ["AdminError", "AdminTLSError", "AnswerTooLargeError", "ChannelNotFoundError",
           "HTTPDeadlineError", "HTTPStatusError", "LookupdError", "NodeUnreachableError",
           "NotFoundError", "TopicNotFoundError", "UnexpectedAnswerError"]


class AdminError(NSQError):
    """Base class of the admin clients' errors."""


class NodeUnreachableError(AdminError, ConnectError):
    """nsqd or nsqlookupd did not answer over HTTP (refused, reset, timed out)."""


class HTTPDeadlineError(NodeUnreachableError, NSQTimeoutError):
    """No complete answer within the request's deadline (the whole request: connect,
    send, the head and every byte of the body; a server that drips its answer cannot
    stretch it). The message names the URL and the deadline. Transient: a later attempt
    may be quicker."""


class AdminTLSError(AdminError, TLSError):
    """The HTTPS handshake failed (the node's certificate not verified, a client
    certificate refused): the same on every attempt, so not transient."""


class HTTPStatusError(AdminError, HTTPAnswerError):
    """The node answered with a status other than 2xx. ``status`` is the HTTP status,
    ``message`` what nsqd said (e.g. ``"INVALID_TOPIC"``), ``url`` what was asked."""


class NotFoundError(HTTPStatusError):
    """404: the topic or channel does not exist on that node; or a tombstone that
    matched no producer (lookupd answered 200: ``status`` 200, ``message``
    ``"NODE_NOT_FOUND"``)."""


class TopicNotFoundError(NotFoundError):
    """404 ``TOPIC_NOT_FOUND``."""


class ChannelNotFoundError(NotFoundError):
    """404 ``CHANNEL_NOT_FOUND``."""


class UnexpectedAnswerError(AdminError, ValueError):
    """A 2xx answer that is not what nsqd / nsqlookupd send (not JSON, missing fields),
    or an answer that is not HTTP at all (nsqd's TCP port answers ``E_BAD_PROTOCOL``):
    usually an address that is some other server's or port; not transient."""


class AnswerTooLargeError(UnexpectedAnswerError):
    """The answer is larger than the size limit of its kind
    (:data:`nsq_spark.admin.transport.ANSWER_LIMITS`): refused from its
    ``Content-Length`` before any of it is read, or once that many bytes arrived. The
    message names the URL and the limit. Not transient."""


class LookupdError(UnexpectedAnswerError):
    """A lookupd answered something that is not a lookup response."""
