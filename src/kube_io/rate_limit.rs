//! The operator's budget of API requests (`--api-qps`, `--api-burst`): a token bucket in front
//! of the kube client, so that a burst of reconciles (thousands of Databases at start) cannot
//! flood the API server. A watch counts once, when it starts. `Bucket` is the pure arithmetic;
//! `RateLimit` the tower service that waits for a token before the request goes out.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Requests per second on average and at most `burst` at once; `qps` 0 means no limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiLimits {
    pub qps: f64,
    pub burst: u32,
}

impl ApiLimits {
    /// Why these limits cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if !self.qps.is_finite() || self.qps < 0.0 {
            return Err(format!(
                "--api-qps must be 0 (no limit) or positive, not {}",
                self.qps
            ));
        }
        if self.qps > 0.0 && self.burst == 0 {
            return Err("--api-burst must be at least 1 when --api-qps limits requests".into());
        }
        Ok(())
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
pub struct Bucket {
    limits: ApiLimits,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    pub fn new(limits: ApiLimits, now: Instant) -> Bucket {
        Bucket {
            limits,
            tokens: f64::from(limits.burst),
            refilled: now,
        }
    }

    /// Takes a token (`None`) or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        if self.limits.qps <= 0.0 {
            return None;
        }
        let refill = now.saturating_duration_since(self.refilled).as_secs_f64() * self.limits.qps;
        self.tokens = (self.tokens + refill).min(f64::from(self.limits.burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        Some(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.limits.qps,
        ))
    }
}

/// Puts a [`RateLimit`] in front of a service.
pub struct RateLimitLayer(pub ApiLimits);

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: Bucket::new(self.0, Instant::now()),
            token: false,
            wait: None,
        }
    }
}

/// Not ready until the bucket gives a token (the kube client buffers requests in front of it).
pub struct RateLimit<S> {
    inner: S,
    bucket: Bucket,
    /// A token taken for the next call.
    token: bool,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.token {
            if let Some(wait) = self.wait.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.wait = None;
            }
            match self.bucket.take(Instant::now()) {
                None => self.token = true,
                Some(delay) => self.wait = Some(Box::pin(tokio::time::sleep(delay))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(qps: f64, burst: u32) -> ApiLimits {
        ApiLimits { qps, burst }
    }

    #[test]
    fn a_burst_goes_at_once_then_one_token_per_period() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(limits(10.0, 3), t0);
        assert_eq!(
            [bucket.take(t0), bucket.take(t0), bucket.take(t0)],
            [None, None, None]
        );
        let wait = bucket.take(t0).expect("the burst is spent");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(t0 + Duration::from_millis(100)), None);
    }

    #[test]
    fn tokens_never_pile_up_beyond_the_burst() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(limits(10.0, 2), t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!([bucket.take(later), bucket.take(later)], [None, None]);
        assert!(bucket.take(later).is_some());
    }

    #[test]
    fn qps_zero_is_no_limit() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(limits(0.0, 0), t0);
        assert!((0..10_000).all(|_| bucket.take(t0).is_none()));
    }

    #[test]
    fn impossible_limits_are_refused() {
        assert!(limits(-1.0, 10).check().is_err());
        assert!(limits(f64::NAN, 10).check().is_err());
        assert!(limits(5.0, 0).check().is_err());
        assert!(limits(0.0, 0).check().is_ok());
        assert!(limits(50.0, 100).check().is_ok());
    }

    #[tokio::test]
    async fn the_service_waits_for_tokens() {
        use tower::ServiceExt;
        let calls =
            tower::service_fn(|(): ()| async { Ok::<_, std::convert::Infallible>(Instant::now()) });
        let mut svc = RateLimitLayer(limits(20.0, 2)).layer(calls);
        let t0 = Instant::now();
        let mut after = Vec::new();
        for _ in 0..4 {
            let at = svc.ready().await.unwrap().call(()).await.unwrap();
            after.push((at - t0).as_millis());
        }
        // Two at once, then one per 50 ms (a busy machine may only be later).
        assert!(after[1] < 45, "{after:?}");
        assert!(after[2] >= 45 && after[3] >= 95, "{after:?}");
    }
}
