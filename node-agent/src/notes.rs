//! What the agent tells a Pod's owner about each placement: a note per decision (where the
//! container went and why, or why it was left alone), handed to a bounded queue that never
//! blocks the hook. `kube_link` turns the notes into Events on the Pod (`kubectl describe pod`).

use crate::hook::Hook;
use std::sync::OnceLock;
use tokio::sync::mpsc;

/// How many notes may wait for the API server; beyond that new ones are dropped (counted).
pub const QUEUE: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Placed: `TopologyPlaced` (Normal).
    Placed,
    /// Left unadjusted because something went wrong (fail open): `TopologyNotPlaced` (Warning).
    FailedOpen,
    /// Placed, but without a per-Pod control it asked for: `TopologyNotHonoured` (Warning).
    NotHonoured,
    /// Moved to another NUMA node by the usage rebalancer: `TopologyRebalanced` (Normal).
    Rebalanced,
    /// The kubelet's devices of the container could not be read (its pod-resources API failed
    /// or was late): placed without their hint, `TopologyDeviceHintUnavailable` (Warning).
    DeviceHintUnavailable,
    /// Placed on none of its devices' NUMA nodes (no room there, or a node the machine lacks):
    /// `TopologyDeviceHintNotHonoured` (Warning).
    DeviceHintNotHonoured,
}

/// One decision about one container of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub kind: Kind,
    /// `create` or `update`.
    pub hook: Hook,
    pub pod_uid: String,
    pub pod_name: String,
    pub namespace: String,
    pub container: String,
    /// e.g. `cpus 24-47 (numa1), mems 1: fits numa`, or why it was not placed.
    pub message: String,
}

impl Note {
    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            Kind::Placed => "TopologyPlaced",
            Kind::FailedOpen => "TopologyNotPlaced",
            Kind::NotHonoured => "TopologyNotHonoured",
            Kind::Rebalanced => "TopologyRebalanced",
            Kind::DeviceHintUnavailable => "TopologyDeviceHintUnavailable",
            Kind::DeviceHintNotHonoured => "TopologyDeviceHintNotHonoured",
        }
    }

    /// The Event message (at most 1 kB, as the API requires), naming the container.
    pub fn text(&self) -> String {
        let mut s = format!("container {}: {}", self.container, self.message);
        if s.len() > 1000 {
            let mut cut = 1000;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
        }
        s
    }
}

/// Where the agent puts notes: nowhere until a consumer is attached.
#[derive(Debug, Default)]
pub struct Sink {
    tx: OnceLock<mpsc::Sender<Note>>,
}

impl Sink {
    /// Attaches a consumer (once; later calls are ignored) and returns its receiver.
    pub fn attach(&self) -> Option<mpsc::Receiver<Note>> {
        let (tx, rx) = mpsc::channel(QUEUE);
        self.tx.set(tx).ok().map(|()| rx)
    }

    /// Queues a note without waiting; false when it was dropped (no consumer counts as sent).
    pub fn offer(&self, note: Note) -> bool {
        match self.tx.get() {
            Some(tx) => tx.try_send(note).is_ok(),
            None => true,
        }
    }

    pub fn attached(&self) -> bool {
        self.tx.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(msg: &str) -> Note {
        Note {
            kind: Kind::Placed,
            hook: crate::hook::Hook::Create,
            pod_uid: "u".into(),
            pod_name: "p".into(),
            namespace: "default".into(),
            container: "app".into(),
            message: msg.into(),
        }
    }

    #[test]
    fn text_names_the_container_and_stays_under_1kb() {
        assert_eq!(note("cpus 0-3").text(), "container app: cpus 0-3");
        let long = note(&"é".repeat(2000)).text();
        assert!(long.len() <= 1000 && long.starts_with("container app: "));
    }

    #[test]
    fn sink_never_blocks_and_drops_when_full() {
        let s = Sink::default();
        assert!(
            s.offer(note("before a consumer")),
            "no consumer: nothing to drop"
        );
        let mut rx = s.attach().expect("first attach");
        assert!(s.attach().is_none(), "one consumer only");
        for _ in 0..QUEUE {
            assert!(s.offer(note("x")));
        }
        assert!(!s.offer(note("one too many")), "full queue drops");
        assert!(rx.try_recv().is_ok());
        assert!(s.offer(note("room again")));
    }
}
