//! A proxy's intercepted call when its own handler fails: the call still reaches the runtime
//! unadjusted, unless the runtime has it already.
//!
//! Each intercepted call runs on a task of its own (to the end even if the caller goes away).
//! A panic on that task before the call was sent to the runtime forwards the call as it came
//! (fail open: the container is made, only not placed). After it was sent, the runtime has
//! acted on it and sending it again would act twice (a second create), so the caller gets an
//! error and retries, as after any runtime error; the periodic comparison picks up what the
//! runtime did.

use crate::hook::Hook;
use crate::metrics::{ErrorKind, Metrics};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once an intercepted call has been sent to the runtime. Carried in the request's
/// extensions, so the one function that sends marks it.
#[derive(Clone, Debug, Default)]
pub struct Sent(Arc<AtomicBool>);

impl Sent {
    pub fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Marks the flag a request carries, if it carries one.
    pub fn mark_in(extensions: &hyper::http::Extensions) {
        if let Some(s) = extensions.get::<Sent>() {
            s.mark();
        }
    }
}

/// How an intercepted call's task ended.
#[derive(Debug)]
pub enum Outcome<R> {
    /// The handler answered.
    Answered(R),
    /// It failed before the call reached the runtime: forward the call unadjusted.
    Forward,
    /// It failed after the runtime had the call: answer with an error.
    Lost(String),
}

/// Runs `handler` on a task of its own and says what to do with the call if it panics.
pub async fn run<R, H>(hook: Hook, metrics: &Metrics, sent: &Sent, handler: H) -> Outcome<R>
where
    R: Send + 'static,
    H: Future<Output = R> + Send + 'static,
{
    let err = match tokio::spawn(handler).await {
        Ok(r) => return Outcome::Answered(r),
        Err(e) => e,
    };
    metrics.count_error(hook, ErrorKind::Panic);
    if sent.is_set() {
        tracing::error!(
            hook = hook.as_str(),
            "the proxy failed after the runtime had the call: {err}"
        );
        Outcome::Lost(err.to_string())
    } else {
        tracing::error!(
            hook = hook.as_str(),
            "the proxy failed before the runtime had the call; forwarded unadjusted: {err}"
        );
        Outcome::Forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_handler_that_fails_before_sending_forwards_the_call_and_after_sending_does_not() {
        let m = Metrics::new();
        let sent = Sent::default();
        let answered = run(Hook::Create, &m, &sent, async { 7 }).await;
        assert!(matches!(answered, Outcome::Answered(7)));

        let early = run(Hook::Create, &m, &sent, async {
            #[allow(clippy::panic)]
            if true {
                panic!("before sending");
            }
            0
        })
        .await;
        assert!(matches!(early, Outcome::Forward), "{early:?}");

        let mut ext = hyper::http::Extensions::new();
        ext.insert(sent.clone());
        let late = run(Hook::Create, &m, &sent, async move {
            Sent::mark_in(&ext);
            #[allow(clippy::panic)]
            if true {
                panic!("after sending");
            }
            0
        })
        .await;
        assert!(matches!(late, Outcome::Lost(_)), "{late:?}");
        assert!(
            m.render()
                .contains(r#"tap_errors_total{hook="create",kind="panic"} 2"#),
            "{}",
            m.render()
        );
    }
}
