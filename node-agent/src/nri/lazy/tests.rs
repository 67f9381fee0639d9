use super::*;
use crate::nri::convert::tests::pod;
use crate::nri::proto::{LinuxContainer, StateChangeEvent, StopContainerRequest};

fn container(id: &str) -> Container {
    let mut c = Container::new();
    c.id = id.into();
    c.pod_sandbox_id = "sb".into();
    c.name = "app".into();
    c.pid = 4242;
    c.env = vec!["PATH=/bin".into(), "NVIDIA_VISIBLE_DEVICES=0".into()];
    c.args = vec!["sleep".into(), "3600".into()];
    c.annotations.insert(
        "io.kubernetes.cri.container-type".into(),
        "container".into(),
    );
    let mut l = LinuxContainer::new();
    l.cgroups_path = "/kubepods/burstable/podu1:cri-containerd:c1".into();
    c.linux = Some(l).into();
    c
}

fn event(e: Event, c: Option<Container>) -> Vec<u8> {
    let mut ev = StateChangeEvent::new();
    ev.event = e.into();
    ev.pod = Some(pod()).into();
    ev.container = c.into();
    ev.write_to_bytes().unwrap()
}

#[test]
fn an_event_reads_its_kind_and_id_and_decodes_the_rest_on_demand() {
    let c = container("c1");
    let ev = LazyEvent::decode(event(Event::POST_START_CONTAINER, Some(c.clone()))).unwrap();
    assert_eq!(ev.event, Ok(Event::POST_START_CONTAINER));
    assert_eq!(ev.encoded.container_id, "c1");
    assert_eq!(ev.encoded.container().unwrap(), c);
    assert_eq!(ev.encoded.pod().unwrap(), Some(pod()));
}

#[test]
fn a_stop_reads_the_id_of_its_container() {
    let mut req = StopContainerRequest::new();
    req.pod = Some(pod()).into();
    req.container = Some(container("c2")).into();
    let stop = LazyStop::decode(req.write_to_bytes().unwrap()).unwrap();
    assert_eq!(stop.encoded.container_id, "c2");
    assert_eq!(stop.encoded.container().unwrap(), container("c2"));
}

#[test]
fn what_is_absent_reads_as_empty() {
    let ev = LazyEvent::decode(event(Event::REMOVE_CONTAINER, None)).unwrap();
    assert_eq!(ev.event, Ok(Event::REMOVE_CONTAINER));
    assert_eq!(ev.encoded.container_id, "");
    assert_eq!(ev.encoded.container().unwrap(), Container::new());
    // An empty message: event UNKNOWN (0), nothing else.
    let ev = LazyEvent::decode(Vec::new()).unwrap();
    assert_eq!(ev.event, Ok(Event::UNKNOWN));
    assert_eq!(ev.encoded.pod().unwrap(), None);
    let stop = LazyStop::decode(Vec::new()).unwrap();
    assert_eq!(stop.encoded.container_id, "");
}

#[test]
fn an_event_this_build_does_not_know_keeps_its_number() {
    // field 1, varint 99
    let ev = LazyEvent::decode(vec![0x08, 99]).unwrap();
    assert_eq!(ev.event, Err(99));
}

#[test]
fn unknown_fields_of_every_wire_type_are_skipped() {
    let mut buf = event(Event::POST_START_CONTAINER, Some(container("c3")));
    // field 20 fixed64, field 21 fixed32, field 22 varint, field 23 bytes
    buf.extend([0xa1, 0x01, 1, 2, 3, 4, 5, 6, 7, 8]);
    buf.extend([0xad, 0x01, 1, 2, 3, 4]);
    buf.extend([0xb0, 0x01, 0xff, 0x01]);
    buf.extend([0xba, 0x01, 2, b'h', b'i']);
    let ev = LazyEvent::decode(buf).unwrap();
    assert_eq!(ev.encoded.container_id, "c3");
    assert_eq!(ev.event, Ok(Event::POST_START_CONTAINER));
}

#[test]
fn a_cut_message_is_an_error_never_a_panic() {
    let full = event(Event::POST_START_CONTAINER, Some(container("c4")));
    let mut errors = 0;
    for n in 0..full.len() {
        if LazyEvent::decode(full[..n].to_vec()).is_err() {
            errors += 1;
        }
    }
    // Most prefixes end inside a field (a few end between top-level fields).
    assert!(errors > full.len() / 2, "{errors} of {}", full.len());
    assert_eq!(
        LazyEvent::decode(vec![0x1a, 0x05, 0x0a]).unwrap_err(),
        WireError::Truncated
    );
    let mut long = vec![0x08];
    long.extend([0xff; 10]);
    long.push(0x01);
    assert_eq!(LazyEvent::decode(long).unwrap_err(), WireError::LongVarint);
    // A length of 2^63 does not overflow.
    let mut huge = vec![0x1a];
    huge.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    assert_eq!(LazyEvent::decode(huge).unwrap_err(), WireError::Truncated);
    assert_eq!(
        LazyEvent::decode(vec![0x0b]).unwrap_err(),
        WireError::WireType(3)
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A fixed xorshift sequence: the same inputs every run.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let base = event(Event::POST_START_CONTAINER, Some(container("c5")));
    for _ in 0..20_000 {
        let mut buf = base.clone();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() as usize) % buf.len();
            buf[at] = next() as u8;
        }
        if let Ok(ev) = LazyEvent::decode(buf.clone()) {
            let _ = ev.encoded.container();
            let _ = ev.encoded.pod();
        }
        let _ = LazyStop::decode(buf);
    }
}

#[test]
fn an_id_that_is_not_utf8_is_an_error() {
    // container (field 3) holding id (field 1) = [0xff]
    let buf = vec![0x1a, 0x03, 0x0a, 0x01, 0xff];
    assert_eq!(LazyEvent::decode(buf).unwrap_err(), WireError::NotUtf8);
}
