//! Pod Events from placement notes ([`crate::notes`]): `TopologyPlaced` (Normal),
//! `TopologyNotPlaced` and the other Warnings ([`crate::notes::Kind`]), regarding the Pod's container (`spec.containers{name}`, as
//! the kubelet does), so `kubectl describe pod` lists them. kube-runtime's recorder writes them
//! (`events.k8s.io/v1`) and folds a repeat of the same event within minutes into a series; a
//! token bucket bounds the writes per node, and notes beyond it are dropped and counted.

use crate::hook::Hook;
use crate::metrics::Metrics;
use crate::notes::{Kind, Note};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The reporting controller named in the Events.
pub const CONTROLLER: &str = "kunpeng-tap-agent";
/// Sustained Events per second per node, and the burst above it.
pub const RATE: f64 = 5.0;
pub const BURST: f64 = 50.0;

/// The Pod container a note is about.
pub fn regarding(n: &Note) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(n.pod_name.clone()),
        namespace: Some(n.namespace.clone()),
        uid: (!n.pod_uid.is_empty()).then(|| n.pod_uid.clone()),
        field_path: (!n.container.is_empty())
            .then(|| format!("spec.containers{{{}}}", n.container)),
        ..Default::default()
    }
}

pub fn event(n: &Note) -> Event {
    Event {
        type_: match n.kind {
            Kind::Placed | Kind::Rebalanced => EventType::Normal,
            Kind::FailedOpen
            | Kind::NotHonoured
            | Kind::DeviceHintUnavailable
            | Kind::DeviceHintNotHonoured => EventType::Warning,
        },
        reason: n.reason().into(),
        note: Some(n.text()),
        action: if n.hook == Hook::Update {
            "Resize".into()
        } else {
            "Place".into()
        },
        secondary: None,
    }
}

/// A token bucket: `rate` tokens a second up to `burst`.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Bucket {
        Bucket {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Writes the notes as Events until the queue closes.
pub async fn publish(
    client: kube::Client,
    node: &str,
    mut rx: mpsc::Receiver<Note>,
    metrics: Arc<Metrics>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: CONTROLLER.into(),
            instance: Some(format!("{CONTROLLER}-{node}")),
        },
    );
    let mut bucket = Bucket::new(RATE, BURST, Instant::now());
    while let Some(n) = rx.recv().await {
        if !bucket.take(Instant::now()) {
            metrics.count_error(n.hook, crate::metrics::ErrorKind::EventDropped);
            continue;
        }
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            recorder.publish(&event(&n), &regarding(&n)),
        )
        .await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(pod = %n.pod_name, namespace = %n.namespace, "recording the Pod Event: {e}");
                metrics.count_error(n.hook, crate::metrics::ErrorKind::Event);
            }
            Err(_) => metrics.count_error(n.hook, crate::metrics::ErrorKind::Event),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(kind: Kind, hook: Hook) -> Note {
        Note {
            kind,
            hook,
            pod_uid: "uid-1".into(),
            pod_name: "web".into(),
            namespace: "shop".into(),
            container: "app".into(),
            message: "cpus 24-47 (numa1): fits numa".into(),
        }
    }

    #[test]
    fn events_regard_the_container_of_the_pod() {
        let n = note(Kind::Placed, Hook::Create);
        let r = regarding(&n);
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.uid.as_deref(), Some("uid-1"));
        assert_eq!(r.field_path.as_deref(), Some("spec.containers{app}"));
        let e = event(&n);
        assert_eq!(e.type_, EventType::Normal);
        assert_eq!(e.reason, "TopologyPlaced");
        assert_eq!(e.action, "Place");
        assert_eq!(
            e.note.as_deref(),
            Some("container app: cpus 24-47 (numa1): fits numa")
        );
        let w = event(&note(Kind::FailedOpen, Hook::Update));
        assert_eq!(
            (w.type_, w.reason.as_str(), w.action.as_str()),
            (EventType::Warning, "TopologyNotPlaced", "Resize")
        );
    }

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(2.0, 3.0, t0);
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0), "burst spent");
        assert!(
            b.take(t0 + Duration::from_millis(500)),
            "one token after 0.5 s at 2/s"
        );
        assert!(!b.take(t0 + Duration::from_millis(500)));
        assert!(
            (0..3).all(|_| b.take(t0 + Duration::from_secs(60))),
            "refills to the burst only"
        );
        assert!(!b.take(t0 + Duration::from_secs(60)));
    }
}
