//! The label value of `drainshim_guard_requests_total{code}`: the gRPC
//! status name a request ended with, or the HTTP status class.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// What a request proxied by the guard ended with
/// (`drainshim_guard_requests_total{code}`): the gRPC status name the client
/// got (from trailers, or the headers of a trailers-only answer), or, for
/// requests that are not gRPC, the HTTP status class. `CANCELLED` also
/// stands for a client that went away before any answer.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum Code {
    OK,
    CANCELLED,
    UNKNOWN,
    INVALID_ARGUMENT,
    DEADLINE_EXCEEDED,
    NOT_FOUND,
    ALREADY_EXISTS,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    FAILED_PRECONDITION,
    ABORTED,
    OUT_OF_RANGE,
    UNIMPLEMENTED,
    INTERNAL,
    UNAVAILABLE,
    DATA_LOSS,
    UNAUTHENTICATED,
    Http1xx,
    Http2xx,
    Http3xx,
    Http4xx,
    Http5xx,
}

/// Every [`Code`], in gRPC number order then the HTTP classes: node mode
/// enumerates the series with it.
pub const CODES: [Code; 22] = [
    Code::OK,
    Code::CANCELLED,
    Code::UNKNOWN,
    Code::INVALID_ARGUMENT,
    Code::DEADLINE_EXCEEDED,
    Code::NOT_FOUND,
    Code::ALREADY_EXISTS,
    Code::PERMISSION_DENIED,
    Code::RESOURCE_EXHAUSTED,
    Code::FAILED_PRECONDITION,
    Code::ABORTED,
    Code::OUT_OF_RANGE,
    Code::UNIMPLEMENTED,
    Code::INTERNAL,
    Code::UNAVAILABLE,
    Code::DATA_LOSS,
    Code::UNAUTHENTICATED,
    Code::Http1xx,
    Code::Http2xx,
    Code::Http3xx,
    Code::Http4xx,
    Code::Http5xx,
];

impl Code {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::OK => "OK",
            Code::CANCELLED => "CANCELLED",
            Code::UNKNOWN => "UNKNOWN",
            Code::INVALID_ARGUMENT => "INVALID_ARGUMENT",
            Code::DEADLINE_EXCEEDED => "DEADLINE_EXCEEDED",
            Code::NOT_FOUND => "NOT_FOUND",
            Code::ALREADY_EXISTS => "ALREADY_EXISTS",
            Code::PERMISSION_DENIED => "PERMISSION_DENIED",
            Code::RESOURCE_EXHAUSTED => "RESOURCE_EXHAUSTED",
            Code::FAILED_PRECONDITION => "FAILED_PRECONDITION",
            Code::ABORTED => "ABORTED",
            Code::OUT_OF_RANGE => "OUT_OF_RANGE",
            Code::UNIMPLEMENTED => "UNIMPLEMENTED",
            Code::INTERNAL => "INTERNAL",
            Code::UNAVAILABLE => "UNAVAILABLE",
            Code::DATA_LOSS => "DATA_LOSS",
            Code::UNAUTHENTICATED => "UNAUTHENTICATED",
            Code::Http1xx => "1xx",
            Code::Http2xx => "2xx",
            Code::Http3xx => "3xx",
            Code::Http4xx => "4xx",
            Code::Http5xx => "5xx",
        }
    }
}

impl EncodeLabelValue for Code {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}
