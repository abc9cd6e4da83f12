//! Pure timing rules: the jittered max connection age, and the even spread
//! of stream endings over a drain window.

use std::time::Duration;

/// Max connection age varies by ±10% per connection (gRPC A9), so
/// connections opened together do not all reconnect together.
pub const AGE_JITTER: f64 = 0.10;

/// The age of one connection: `age` scaled by a factor in [0.9, 1.1].
/// `unit` is a uniform sample in [0, 1); values outside are clamped.
pub fn jittered_age(age: Duration, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    let factor = 1.0 - AGE_JITTER + 2.0 * AGE_JITTER * unit;
    age.mul_f64(factor)
}

/// When each of `n` streams is ended, as offsets from the start of a window.
///
/// Stream `i` ends at the middle of the `i`-th of `n` equal slices, so the
/// endings are evenly spaced, all fall inside the window, and any 100 ms of
/// the window sees the same share of reconnects.
pub fn spread_offsets(n: usize, window: Duration) -> impl Iterator<Item = Duration> {
    let slice = if n == 0 {
        Duration::ZERO
    } else {
        window.div_f64(n as f64)
    };
    (0..n).map(move |i| slice.mul_f64(i as f64 + 0.5))
}

/// A schedule of endings in time order: `(when, what)`.
pub type Due<T> = std::collections::VecDeque<(tokio::time::Instant, T)>;

/// Adds `fresh` to `due`, spread evenly over `remaining` from `now`
/// ([`spread_offsets`]), keeping the whole schedule in time order: streams
/// that become long-lived later join the rest of the window.
pub fn spread_into<T>(
    due: &mut Due<T>,
    fresh: Vec<T>,
    now: tokio::time::Instant,
    remaining: Duration,
) {
    if fresh.is_empty() {
        return;
    }
    let n = fresh.len();
    let mut merged: Vec<_> = due.drain(..).collect();
    merged.extend(
        fresh
            .into_iter()
            .zip(spread_offsets(n, remaining))
            .map(|(s, off)| (now + off, s)),
    );
    merged.sort_by_key(|(at, _)| *at);
    due.extend(merged);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let age = Duration::from_secs(100);
        assert_eq!(jittered_age(age, 0.0), Duration::from_secs(90));
        assert_eq!(jittered_age(age, 0.5), Duration::from_secs(100));
        assert!(jittered_age(age, 0.999_999) <= Duration::from_secs(110));
        assert_eq!(jittered_age(age, -3.0), Duration::from_secs(90));
        assert_eq!(jittered_age(age, 7.0), Duration::from_secs(110));
    }

    #[test]
    fn offsets_are_even_and_inside_the_window() {
        let window = Duration::from_secs(10);
        let offsets: Vec<_> = spread_offsets(4, window).collect();
        assert_eq!(
            offsets,
            [1250, 3750, 6250, 8750].map(Duration::from_millis).to_vec()
        );
        assert_eq!(spread_offsets(0, window).count(), 0);
        assert!(spread_offsets(5, Duration::ZERO).all(|o| o.is_zero()));
    }

    #[test]
    fn later_streams_join_the_rest_of_the_window_in_order() {
        let now = tokio::time::Instant::now();
        let mut due = Due::new();
        spread_into(&mut due, vec!['a', 'b'], now, Duration::from_secs(4));
        spread_into(
            &mut due,
            vec!['c'],
            now + Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let order: Vec<(u128, char)> = due
            .iter()
            .map(|(at, c)| (at.duration_since(now).as_millis(), *c))
            .collect();
        assert_eq!(order, vec![(1000, 'a'), (2000, 'c'), (3000, 'b')]);
        spread_into(&mut due, Vec::new(), now, Duration::ZERO);
        assert_eq!(due.len(), 3);
    }

    #[test]
    fn offsets_fill_every_bucket_alike() {
        let window = Duration::from_secs(2);
        let mut buckets = [0u32; 20];
        for o in spread_offsets(200, window) {
            buckets[(o.as_millis() / 100) as usize] += 1;
        }
        assert!(buckets.iter().all(|&b| b == 10), "{buckets:?}");
    }
}
