//! A stream's cadence: how often its application writes, learned from the
//! DATA it sends. A quiet stream asked to end between two writes can then
//! end at once when its next write is well off, instead of waiting for
//! that write and ending in the pause after it: the spread of a drain's
//! endings stays the schedule's, not the schedule's plus up to one message
//! interval per stream.

use std::time::Duration;

use tokio::time::Instant;

use super::BURST_GAP;

/// The least room that must be left before the next write is due for an
/// end to go at once: the cancel's way to the application and into its
/// handler on a loaded machine (the application's own timer and the
/// scheduler's jitter are in the learned deviation).
const MIN_MARGIN: Duration = Duration::from_millis(20);

/// The share of the gap kept clear before the next write, beside four
/// deviations and [`MIN_MARGIN`]. Small: every stream asked inside this
/// share of its gap waits for the write and ends right after it, so in a
/// population that writes in step (a broadcast, or streams opened
/// together) those endings land together. A quarter of a 1 s gap made a
/// quarter of a drain's endings a burst once a second (storm peak/mean
/// 3.4 at 2,000 streams); a thirty-second keeps it near the schedule's.
const GAP_SHARE: u32 = 32;

/// When a stream's application writes: bursts of DATA (frames less than
/// [`BURST_GAP`] apart), and the smoothed gap between the starts of two
/// bursts with its mean deviation, smoothed as TCP smooths its round-trip
/// time (RFC 6298: 1/8 and 1/4).
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::guard::relay) struct Cadence {
    /// When the last burst started, and when its last frame came.
    burst_start: Option<Instant>,
    last: Option<Instant>,
    /// The smoothed gap between burst starts, and its deviation; `None`
    /// until a second burst came.
    gap: Option<(Duration, Duration)>,
}

impl Cadence {
    /// The application sent DATA with content on the stream.
    pub(in crate::guard::relay) fn data(&mut self, now: Instant) {
        let new_burst = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= BURST_GAP);
        if new_burst {
            if let Some(start) = self.burst_start {
                self.sample(now.saturating_duration_since(start));
            }
            self.burst_start = Some(now);
        }
        self.last = Some(now);
    }

    /// When the application last sent DATA on the stream.
    pub(in crate::guard::relay) fn last(&self) -> Option<Instant> {
        self.last
    }

    fn sample(&mut self, gap: Duration) {
        self.gap = Some(match self.gap {
            // The first gap says little: its deviation starts at half of it,
            // so the cadence is trusted only once the gaps agree.
            None => (gap, gap / 2),
            Some((mean, dev)) => {
                let diff = mean.abs_diff(gap);
                ((mean * 7 + gap) / 8, (dev * 3 + diff) / 4)
            }
        });
    }

    /// Whether an end that goes `now` lands well clear of the application's
    /// writes: its last burst is over, and by its cadence the next one is
    /// due no sooner than a margin away (a [`GAP_SHARE`]-th of the gap, four
    /// deviations, [`MIN_MARGIN`], whichever is largest). A stream written
    /// to irregularly, or not yet twice, never is.
    pub(in crate::guard::relay) fn far_from_next(&self, now: Instant) -> bool {
        let (Some(start), Some(last), Some((mean, dev))) = (self.burst_start, self.last, self.gap)
        else {
            return false;
        };
        if now.saturating_duration_since(last) < BURST_GAP {
            return false;
        }
        let margin = (mean / GAP_SHARE).max(dev * 4).max(MIN_MARGIN);
        now + margin <= start + mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A producer that writes one message every `every`, `n` times, from `t0`.
    fn periodic(t0: Instant, every: Duration, n: u32) -> Cadence {
        let mut c = Cadence::default();
        for i in 0..n {
            c.data(t0 + every * i);
        }
        c
    }

    #[test]
    fn a_steady_producer_is_far_from_its_next_write_early_in_its_pause() {
        let t0 = Instant::now();
        let c = periodic(t0, ms(100), 20);
        let last = t0 + ms(100) * 19;
        assert!(!c.far_from_next(last + ms(1)), "still in its burst");
        assert!(c.far_from_next(last + ms(3)));
        assert!(c.far_from_next(last + ms(70)));
        assert!(c.far_from_next(last + ms(80)));
        assert!(
            !c.far_from_next(last + ms(85)),
            "within MIN_MARGIN of its next write"
        );
        assert!(
            !c.far_from_next(last + ms(150)),
            "its next write is overdue"
        );
    }

    #[test]
    fn a_slow_producer_keeps_a_share_of_its_gap_clear() {
        let t0 = Instant::now();
        let c = periodic(t0, ms(1000), 30);
        let last = t0 + ms(1000) * 29;
        assert!(c.far_from_next(last + ms(3)));
        assert!(c.far_from_next(last + ms(960)));
        assert!(
            !c.far_from_next(last + ms(975)),
            "within a thirty-second of the gap"
        );
    }

    #[test]
    fn a_new_or_irregular_stream_is_never_far_from_its_next_write() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        assert!(!c.far_from_next(t0));
        c.data(t0);
        assert!(!c.far_from_next(t0 + ms(10)));
        c.data(t0 + ms(100));
        assert!(!c.far_from_next(t0 + ms(110)), "one gap is no cadence");

        let mut jumpy = Cadence::default();
        let mut t = t0;
        for gap in [10u64, 300, 20, 250, 5, 400, 30, 200]
            .iter()
            .cycle()
            .take(40)
        {
            t += ms(*gap);
            jumpy.data(t);
            assert!(
                !jumpy.far_from_next(t + ms(3)),
                "gap {gap}: no end at once on a stream without a cadence"
            );
        }
    }

    #[test]
    fn frames_of_one_burst_count_as_one_write() {
        let t0 = Instant::now();
        let mut c = Cadence::default();
        for i in 0..20u32 {
            let start = t0 + ms(100) * i;
            c.data(start);
            c.data(start + ms(1));
            c.data(start + Duration::from_micros(1_900));
        }
        let last = t0 + ms(100) * 19 + Duration::from_micros(1_900);
        assert!(c.far_from_next(last + ms(3)));
    }
}
