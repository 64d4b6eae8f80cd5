"""Client library for facefuse deployments (installed as ``facefuse.client``)."""

from facefuse.client.api import AsyncClient, Client, ClientError, Result

__all__ = ["AsyncClient", "Client", "ClientError", "Result"]
