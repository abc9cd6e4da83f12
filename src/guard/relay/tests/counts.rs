//! The guard's counters, as the relay's unit tests read them.

use super::super::super::{Guard, GuardConfig};
use crate::guard::handle::Handle;
use crate::metrics::{Dropped, DroppedLabels, Metrics, Reason, StreamProtocol, TerminatedLabels};

/// A guard and its metrics, to read the counters.
pub(super) fn guard_and_metrics() -> (Handle, Metrics) {
    let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
    let guard = Guard::new(
        GuardConfig::new(([127, 0, 0, 1], 9).into()),
        metrics.clone(),
    )
    .handle();
    (guard, metrics)
}

/// `drainshim_stream_data_dropped_total` and its bytes, for `reason`.
pub(super) fn dropped(m: &Metrics, reason: Dropped) -> (u64, u64) {
    let l = DroppedLabels { reason };
    (
        m.stream_data_dropped.get_or_create(&l).get(),
        m.stream_data_dropped_bytes.get_or_create(&l).get(),
    )
}

pub(super) fn terminated(m: &Metrics, reason: Reason) -> u64 {
    let l = TerminatedLabels {
        reason,
        protocol: StreamProtocol::grpc,
    };
    m.streams_terminated.get_or_create(&l).get()
}

pub(super) fn ungraceful(m: &Metrics, reason: Reason) -> u64 {
    let l = TerminatedLabels {
        reason,
        protocol: StreamProtocol::grpc,
    };
    m.streams_ungraceful.get_or_create(&l).get()
}
