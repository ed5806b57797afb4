"""Failure labels: httpx mapping completeness, HTTP status classification, no leaks."""

from __future__ import annotations

import inspect

import httpx
import pytest

from magi_code.providers.errors import (
    FailureLabel,
    ProviderFailure,
    failure_for_status,
    httpx_exceptions,
    map_httpx_errors,
    stream_failure,
)

SECRET = "https://secret.example/v1?key=sk-SECRET"


def httpx_exception_classes() -> list[type[Exception]]:
    return sorted(
        (
            obj
            for obj in vars(httpx).values()
            if inspect.isclass(obj) and issubclass(obj, Exception)
        ),
        key=lambda cls: cls.__name__,
    )


def instantiate(cls: type[Exception]) -> Exception:
    request = httpx.Request("GET", SECRET)
    if issubclass(cls, httpx.HTTPStatusError):
        return cls(SECRET, request=request, response=httpx.Response(503, request=request))
    if issubclass(cls, httpx.RequestError):
        return cls(SECRET, request=request)
    if cls in (
        httpx.StreamConsumed,
        httpx.StreamClosed,
        httpx.ResponseNotRead,
        httpx.RequestNotRead,
    ):
        return cls()
    return cls(SECRET)


def test_every_httpx_exception_class_has_an_explicit_mapping() -> None:
    missing = [cls.__name__ for cls in httpx_exception_classes() if cls not in httpx_exceptions()]
    assert missing == []


@pytest.mark.parametrize("cls", httpx_exception_classes(), ids=lambda cls: cls.__name__)
def test_map_httpx_errors_turns_each_class_into_a_labelled_failure(
    cls: type[Exception],
) -> None:
    with pytest.raises(ProviderFailure) as info, map_httpx_errors():
        raise instantiate(cls)
    failure = info.value
    assert failure.label in set(FailureLabel)
    assert str(failure) == failure.label.value
    assert "secret" not in repr(failure).lower()
    assert failure.args == (failure.label.value,)


def test_specific_httpx_classes_get_specific_labels() -> None:
    expected = {
        httpx.ConnectError: (FailureLabel.UNAVAILABLE, True),
        httpx.ConnectTimeout: (FailureLabel.TIMEOUT, True),
        httpx.ReadTimeout: (FailureLabel.TIMEOUT, False),
        httpx.RemoteProtocolError: (FailureLabel.STREAM_ERROR, False),
        httpx.ReadError: (FailureLabel.STREAM_ERROR, False),
        httpx.UnsupportedProtocol: (FailureLabel.HTTP_ERROR, False),
        httpx.HTTPStatusError: (FailureLabel.SERVER_ERROR, True),  # 503 in instantiate()
    }
    for cls, (label, retryable) in expected.items():
        with pytest.raises(ProviderFailure) as info, map_httpx_errors():
            raise instantiate(cls)
        assert (info.value.label, info.value.retryable) == (label, retryable), cls


def test_non_httpx_exceptions_pass_through_untouched() -> None:
    with pytest.raises(KeyError), map_httpx_errors():
        raise KeyError("x")


@pytest.mark.parametrize(
    ("status", "kind", "label", "retryable"),
    [
        (401, None, FailureLabel.AUTH_FAILED, False),
        (403, "permission_error", FailureLabel.AUTH_FAILED, False),
        (429, "rate_limit_error", FailureLabel.RATE_LIMITED, True),
        (429, "usage_limit_reached", FailureLabel.QUOTA_EXCEEDED, False),
        (429, "insufficient_quota", FailureLabel.QUOTA_EXCEEDED, False),
        (500, None, FailureLabel.SERVER_ERROR, True),
        (529, "overloaded_error", FailureLabel.SERVER_ERROR, True),
        (408, None, FailureLabel.HTTP_ERROR, True),
        (400, "invalid_request_error", FailureLabel.HTTP_ERROR, False),
        (400, "context_length_exceeded", FailureLabel.CONTEXT_LENGTH_EXCEEDED, False),
        (404, None, FailureLabel.HTTP_ERROR, False),
    ],
)
def test_status_classification(
    status: int, kind: str | None, label: FailureLabel, retryable: bool
) -> None:
    failure = failure_for_status(status, kind, retry_after=1.5)
    assert (failure.label, failure.retryable, failure.status) == (label, retryable, status)


@pytest.mark.parametrize(
    ("error", "label"),
    [
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": SECRET}},
            FailureLabel.STREAM_ERROR,
        ),
        (
            {"code": "context_length_exceeded", "message": SECRET},
            FailureLabel.CONTEXT_LENGTH_EXCEEDED,
        ),
        (
            {"error": {"type": "invalid_request_error", "message": "prompt is too long: 9 > 8"}},
            FailureLabel.CONTEXT_LENGTH_EXCEEDED,
        ),
        ({"code": "rate_limit_exceeded", "message": SECRET}, FailureLabel.RATE_LIMITED),
        ({"code": "insufficient_quota"}, FailureLabel.QUOTA_EXCEEDED),
        ("not an object", FailureLabel.STREAM_ERROR),
    ],
)
def test_in_stream_errors_keep_known_codes_and_drop_text(
    error: object, label: FailureLabel
) -> None:
    failure = stream_failure(error)
    assert failure.label is label
    assert SECRET not in str(failure) + repr(failure)
