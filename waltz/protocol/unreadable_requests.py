"""Unary requests whose bytes do not parse are refused with ``INVALID_ARGUMENT``.

gRPC parses a unary request before it calls the servicer, so a request that does not decode would
end with ``UNKNOWN`` ("Unexpected DecodeError") and a traceback logged at ERROR by gRPC: an alert
for every peer that sends garbage. The streams say ``INVALID_ARGUMENT`` for the same thing, as
the servicers read their messages (docs/design/server.md, "Bounds on what a peer costs"); this
interceptor makes the unary calls say it too.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["UnreadableRequests"]

log = logging.getLogger(__name__)


class _Unreadable:
    """What a request that did not parse is handed to the servicer as: why it did not."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class UnreadableRequests(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # generic in grpc-stubs only
    """A server interceptor: a unary-unary request that does not parse is refused with
    ``INVALID_ARGUMENT`` naming the parse error, logged at INFO; streams are left as they are (their
    servicers read their own messages)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        behaviour: Any = handler.unary_unary  # the servicer's method (a coroutine function here)
        parse = handler.request_deserializer
        method = handler_call_details.method

        def deserialize(data: bytes) -> Any:
            try:
                return parse(data) if parse is not None else data
            except Exception as exc:
                return _Unreadable(f"{type(exc).__name__}: {exc}")

        async def serve(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Unreadable):
                log.info("unreadable %s request from %s: %s", method, context.peer(), request.reason)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unreadable request: {request.reason}")
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(
            serve, request_deserializer=deserialize, response_serializer=handler.response_serializer
        )
