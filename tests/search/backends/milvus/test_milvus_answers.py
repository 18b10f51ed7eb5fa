"""What a read of a Milvus collection raises when the server does not answer: :class:`Unavailable` (a service's
503 with Retry-After), whichever way pymilvus fails, with no server needed."""

import grpc
import pytest

from vlmatch.search.backends.milvus.client import Unavailable
from vlmatch.search.backends.milvus.collection import _answers


class _Deadline(grpc.RpcError):
    """The raw gRPC error pymilvus lets through when its connection recovery fails (a restarting server)."""

    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def __str__(self):
        return "<_InactiveRpcError: status = StatusCode.DEADLINE_EXCEEDED, details = 'Deadline Exceeded'>"


class _Reader:
    loc = "http://127.0.0.1:19530 collection 'photos'"
    items_name, enc_name = "photos_g1_items", "photos_g1_enc"

    def __init__(self, error):
        self.error, self.calls = error, 0

    @_answers
    def search(self):
        self.calls += 1
        raise self.error


def test_a_raw_grpc_deadline_is_the_server_not_answering():
    with pytest.raises(Unavailable, match="the Milvus server did not answer .*DEADLINE_EXCEEDED.*retry in a few"):
        _Reader(_Deadline()).search()


def test_a_milvus_exception_is_the_server_not_answering():
    from pymilvus import MilvusException

    with pytest.raises(Unavailable, match="did not answer"):
        _Reader(MilvusException(message="channel closed")).search()


def test_other_errors_are_not_hidden_as_unavailability():
    with pytest.raises(ValueError, match="a bug"):
        _Reader(ValueError("a bug")).search()
