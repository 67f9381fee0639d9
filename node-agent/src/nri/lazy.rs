//! The two NRI calls that need only a container's id, decoded lazily.
//!
//! containerd sends the whole Pod and the whole container (labels, annotations, arguments,
//! environment, mounts) with every StopContainer and every state change (PostStartContainer,
//! RemoveContainer, ...). The generated service decodes all of it, an allocation per string,
//! before the hook runs; the hook reads the event and the container's id. Here the two
//! methods are served by handlers that read the event and the id off the wire and keep the Pod
//! and the container encoded: [`LazyEvent::container`] and [`LazyEvent::pod`] decode them
//! only where a hook needs them (a container started after its create was given up).
//!
//! [`plugin_service`] is the generated service with these two methods replaced; the rest
//! (Configure, Synchronize, CreateContainer, UpdateContainer, Shutdown) is decoded as before.

use super::proto::{self, Container, Empty, Event, PodSandbox, StopContainerResponse};
use async_trait::async_trait;
use protobuf::{Enum, Message};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use ttrpc::proto::{Codec, ResponseInit};
use ttrpc::r#async::{MethodHandler, Service, TtrpcContext};

/// The service name containerd calls.
const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message ends inside a field")]
    Truncated,
    #[error("a varint is longer than 10 bytes")]
    LongVarint,
    #[error("wire type {0} is not supported")]
    WireType(u8),
    #[error("the container id is not UTF-8")]
    NotUtf8,
}

/// One field of an encoded message: its number and where its value is.
enum Value {
    Varint(u64),
    /// A length-delimited value (string, bytes, embedded message): its bytes.
    Bytes(Range<usize>),
    /// Fixed-width values, skipped.
    Other,
}

/// Reads a varint at `*at`, moving past it.
fn varint(buf: &[u8], at: &mut usize) -> Result<u64, WireError> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *buf.get(*at).ok_or(WireError::Truncated)?;
        *at += 1;
        v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(WireError::LongVarint)
}

/// The fields of the message encoded in `buf[range]`, in order.
fn fields(
    buf: &[u8],
    range: Range<usize>,
) -> impl Iterator<Item = Result<(u64, Value), WireError>> + '_ {
    // Nothing past the range is read.
    let buf = &buf[..range.end.min(buf.len())];
    let end = buf.len();
    let mut at = range.start;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let key = varint(buf, &mut at)?;
            let skip = |at: &mut usize, n: usize| match at.checked_add(n) {
                Some(to) if to <= end => {
                    *at = to;
                    Ok(Value::Other)
                }
                _ => Err(WireError::Truncated),
            };
            let value = match (key & 7) as u8 {
                0 => Value::Varint(varint(buf, &mut at)?),
                1 => skip(&mut at, 8)?,
                5 => skip(&mut at, 4)?,
                2 => {
                    let len =
                        usize::try_from(varint(buf, &mut at)?).map_err(|_| WireError::Truncated)?;
                    let start = at;
                    skip(&mut at, len)?;
                    Value::Bytes(start..at)
                }
                t => return Err(WireError::WireType(t)),
            };
            Ok((key >> 3, value))
        })
    })
}

/// The id (field 1) of the Container encoded in `buf[range]`; empty if it has none.
fn container_id(buf: &[u8], range: Range<usize>) -> Result<String, WireError> {
    let mut id = String::new();
    for f in fields(buf, range) {
        if let (1, Value::Bytes(r)) = f? {
            id = std::str::from_utf8(&buf[r])
                .map_err(|_| WireError::NotUtf8)?
                .to_string();
        }
    }
    Ok(id)
}

/// An encoded Pod and container, each decoded when asked for.
#[derive(Debug, Clone, Default)]
pub struct Encoded {
    payload: Vec<u8>,
    pod: Option<Range<usize>>,
    container: Option<Range<usize>>,
    /// The container's id, read off the wire ("" when the message has no container).
    pub container_id: String,
}

impl Encoded {
    /// Reads `payload`, a message whose Pod is field `pod` and container field `container`.
    fn read(
        payload: Vec<u8>,
        pod: u64,
        container: u64,
    ) -> Result<(Encoded, Option<u64>), WireError> {
        let mut e = Encoded::default();
        let mut first_varint = None;
        for f in fields(&payload, 0..payload.len()) {
            match f? {
                (n, Value::Bytes(r)) if n == pod => e.pod = Some(r),
                (n, Value::Bytes(r)) if n == container => e.container = Some(r),
                (1, Value::Varint(v)) => first_varint = Some(v),
                _ => {}
            }
        }
        if let Some(r) = e.container.clone() {
            e.container_id = container_id(&payload, r)?;
        }
        e.payload = payload;
        Ok((e, first_varint))
    }

    /// The Pod, decoded now (`None` when the message has none).
    pub fn pod(&self) -> protobuf::Result<Option<PodSandbox>> {
        match &self.pod {
            Some(r) => PodSandbox::parse_from_bytes(&self.payload[r.clone()]).map(Some),
            None => Ok(None),
        }
    }

    /// The container, decoded now (the default when the message has none).
    pub fn container(&self) -> protobuf::Result<Container> {
        match &self.container {
            Some(r) => Container::parse_from_bytes(&self.payload[r.clone()]),
            None => Ok(Container::new()),
        }
    }
}

/// A StateChangeEvent: the event and the container's id read, the rest kept encoded.
#[derive(Debug, Clone)]
pub struct LazyEvent {
    /// The event, or its number if this build does not know it.
    pub event: Result<Event, i32>,
    pub encoded: Encoded,
}

impl LazyEvent {
    pub fn decode(payload: Vec<u8>) -> Result<LazyEvent, WireError> {
        let (encoded, event) = Encoded::read(payload, 2, 3)?;
        // An enum is an int32 on the wire: a negative one is sign-extended to 64 bits.
        let n = event.unwrap_or(0) as i32;
        let event = Event::from_i32(n).ok_or(n);
        Ok(LazyEvent { event, encoded })
    }
}

/// A StopContainerRequest: the container's id read, the rest kept encoded.
#[derive(Debug, Clone)]
pub struct LazyStop {
    pub encoded: Encoded,
}

impl LazyStop {
    pub fn decode(payload: Vec<u8>) -> Result<LazyStop, WireError> {
        let (encoded, _) = Encoded::read(payload, 1, 2)?;
        Ok(LazyStop { encoded })
    }
}

/// A plugin's StateChange and StopContainer, on lazily decoded requests.
#[async_trait]
pub trait LazyHooks: Sync {
    async fn state_change(&self, ev: LazyEvent) -> ttrpc::Result<Empty>;
    async fn stop_container(&self, req: LazyStop) -> ttrpc::Result<StopContainerResponse>;
}

/// The Plugin service of `plugin`, StateChange and StopContainer served lazily.
pub fn plugin_service<P>(plugin: Arc<P>) -> HashMap<String, Service>
where
    P: proto::Plugin + LazyHooks + Send + Sync + 'static,
{
    let mut services = proto::create_plugin(plugin.clone());
    if let Some(s) = services.get_mut(PLUGIN_SERVICE) {
        let p: Arc<dyn LazyHooks + Send + Sync> = plugin;
        s.methods
            .insert("StateChange".into(), Box::new(StateChange(p.clone())));
        s.methods.insert("StopContainer".into(), Box::new(Stop(p)));
    }
    services
}

struct StateChange(Arc<dyn LazyHooks + Send + Sync>);
struct Stop(Arc<dyn LazyHooks + Send + Sync>);

/// A request that could not be read: answered as the generated handlers answer one.
fn unreadable(e: WireError) -> ttrpc::Error {
    ttrpc::Error::Others(format!("Unpack request error {e}"))
}

/// The response of a hook's result, as the generated handlers build it.
fn respond<M: Message>(result: ttrpc::Result<M>) -> ttrpc::Result<ttrpc::Response> {
    Ok(match result {
        Ok(rep) => {
            let payload = Codec::encode(&rep)
                .map_err(|e| ttrpc::Error::Others(format!("Encoding response {e:?}")))?;
            let mut res = ttrpc::Response::init_status(ttrpc::get_status(ttrpc::Code::OK, ""));
            res.set_payload(payload);
            res
        }
        Err(ttrpc::Error::RpcStatus(s)) => ttrpc::Response::init_status(s),
        Err(x) => {
            ttrpc::Response::init_status(ttrpc::get_status(ttrpc::Code::UNKNOWN, format!("{x:?}")))
        }
    })
}

#[async_trait]
impl MethodHandler for StateChange {
    async fn handler(
        &self,
        _ctx: TtrpcContext,
        mut req: ttrpc::Request,
    ) -> ttrpc::Result<ttrpc::Response> {
        let ev = LazyEvent::decode(std::mem::take(&mut req.payload)).map_err(unreadable)?;
        respond(self.0.state_change(ev).await)
    }
}

#[async_trait]
impl MethodHandler for Stop {
    async fn handler(
        &self,
        _ctx: TtrpcContext,
        mut req: ttrpc::Request,
    ) -> ttrpc::Result<ttrpc::Response> {
        let stop = LazyStop::decode(std::mem::take(&mut req.payload)).map_err(unreadable)?;
        respond(self.0.stop_container(stop).await)
    }
}

#[cfg(test)]
mod tests;
