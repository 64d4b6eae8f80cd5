"""Client library for facefuse deployments (installed as ``facefuse.client``)."""

from facefuse.client.api import (
    NO_RETRY,
    AsyncClient,
    Client,
    ClientError,
    Result,
    RetryPolicy,
    retryable,
)

__all__ = [
    "NO_RETRY",
    "AsyncClient",
    "Client",
    "ClientError",
    "Result",
    "RetryPolicy",
    "retryable",
]
