//! Client-side rate limit on the controller's API requests (`--qps`, `--burst`): a token bucket
//! in the client's tower stack, as client-go's flowcontrol limiter does for Argo. A request that
//! finds the bucket empty waits for a token; a long watch costs one token when it starts.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refill at `qps` per second up to `burst`; the bucket starts full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub qps: f64,
    pub burst: u32,
}

/// The bucket itself: how many requests may go now, and when the next one may if none.
#[derive(Debug)]
struct Bucket {
    limit: Limit,
    tokens: f64,
    refilled_at: Instant,
}

impl Bucket {
    fn new(limit: Limit, now: Instant) -> Self {
        Self {
            limit,
            tokens: f64::from(limit.burst),
            refilled_at: now,
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limit.qps).min(f64::from(self.limit.burst));
        self.refilled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.limit.qps,
            ))
        }
    }
}

/// Wraps the client's service in a [`Throttle`].
#[derive(Debug, Clone, Copy)]
pub struct ThrottleLayer {
    limit: Limit,
}

impl ThrottleLayer {
    pub fn new(limit: Limit) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            bucket: Bucket::new(self.limit, Instant::now()),
            waiting: None,
            holds_token: false,
        }
    }
}

/// Ready only once a token is taken. kube's client calls it from one buffer worker, so one
/// bucket paces every request of the process.
pub struct Throttle<S> {
    inner: S,
    bucket: Bucket,
    waiting: Option<Pin<Box<Sleep>>>,
    /// A token taken by `poll_ready` and not yet spent by `call`.
    holds_token: bool,
}

impl<S, Request> Service<Request> for Throttle<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.holds_token {
            if let Some(waiting) = self.waiting.as_mut() {
                ready!(waiting.as_mut().poll(cx));
                self.waiting = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.holds_token = true,
                Err(wait) => {
                    self.waiting = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.holds_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_paces_at_qps() {
        let start = Instant::now();
        let mut bucket = Bucket::new(
            Limit {
                qps: 40.0,
                burst: 80,
            },
            start,
        );
        for _ in 0..80 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).expect_err("the burst is spent");
        assert_eq!(wait, Duration::from_millis(25));
        let later = start + Duration::from_millis(25);
        assert_eq!(bucket.take(later), Ok(()));
        assert!(bucket.take(later).is_err());
        // A long quiet spell refills to the burst, no further.
        let much_later = later + Duration::from_secs(3600);
        for _ in 0..80 {
            assert_eq!(bucket.take(much_later), Ok(()));
        }
        assert!(bucket.take(much_later).is_err());
    }

    #[tokio::test]
    async fn requests_past_the_burst_wait_for_tokens() {
        use tower::ServiceExt;
        let limit = Limit {
            qps: 100.0,
            burst: 5,
        };
        let mut service = ThrottleLayer::new(limit).layer(tower::service_fn(|n: u32| async move {
            Ok::<u32, std::convert::Infallible>(n)
        }));
        let start = Instant::now();
        for n in 0..25 {
            let answer = service
                .ready()
                .await
                .expect("never fails")
                .call(n)
                .await
                .expect("never fails");
            assert_eq!(answer, n);
        }
        // 5 at once, then 20 more at 100 per second: 200 ms at least (more on a loaded machine).
        let took = start.elapsed();
        assert!(
            (Duration::from_millis(190)..Duration::from_secs(2)).contains(&took),
            "{took:?}"
        );
    }
}
