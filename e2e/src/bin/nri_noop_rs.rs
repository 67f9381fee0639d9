//! tap-nri-noop: an NRI plugin that changes nothing, on kunpeng-tap's own transport.
//!
//! It connects and registers through the agent's code (`node_agent::nri::connection`: the
//! `nri::mux` trunk, the generated `nri::proto` ttrpc service, ttrpc 0.10 async), runs on a
//! Tokio current-thread runtime as the agent does (`tap_bin_support::Threads::One`),
//! subscribes to exactly the agent's events (`convert::SUBSCRIBED_EVENTS`), decodes them as
//! the agent does (`nri::lazy`: StopContainer and state changes only to the container's id)
//! and answers every call with an empty response. The start-path benchmark runs it as row
//! (f): what the NRI hop costs a plugin on this stack, under the agent's own work
//! (docs/design/start-path.md).
//!
//! It counts the calls it answered and prints them when it ends (SIGTERM, Ctrl-C, the
//! runtime's Shutdown or a closed connection), one line `tap-nri-noop calls: create=N ...`,
//! so the benchmark can check that every container went through it.

use anyhow::{Context, Result};
use async_trait::async_trait;
use clap::Parser;
use node_agent::nri::connection::Connection;
use node_agent::nri::convert::{event_mask, SUBSCRIBED_EVENTS};
use node_agent::nri::lazy::{plugin_service, LazyEvent, LazyHooks, LazyStop};
use node_agent::nri::proto::{
    self, ConfigureRequest, ConfigureResponse, CreateContainerRequest, CreateContainerResponse,
    Empty, Event, StopContainerResponse, SynchronizeRequest, SynchronizeResponse,
    UpdateContainerRequest, UpdateContainerResponse,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::TtrpcContext;

#[derive(Parser, Debug)]
#[command(about = "An NRI plugin that changes nothing, on kunpeng-tap's NRI transport")]
struct Args {
    /// The runtime's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    nri_socket: PathBuf,
    /// The plugin's name (containerd logs it as `<index>-<name>`).
    #[arg(long, default_value = "noop-rs")]
    name: String,
    /// The plugin's index (its place among the runtime's plugins).
    #[arg(long, default_value = "10")]
    index: String,
}

/// The calls answered, by kind (the line printed at the end names them).
#[derive(Default)]
struct Calls {
    configure: AtomicU64,
    synchronize: AtomicU64,
    create: AtomicU64,
    update: AtomicU64,
    stop: AtomicU64,
    post_start: AtomicU64,
    post_update: AtomicU64,
    remove: AtomicU64,
    other: AtomicU64,
}

impl Calls {
    fn line(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "tap-nri-noop calls: configure={} synchronize={} create={} post_start={} update={} \
             post_update={} stop={} remove={} other={}",
            n(&self.configure),
            n(&self.synchronize),
            n(&self.create),
            n(&self.post_start),
            n(&self.update),
            n(&self.post_update),
            n(&self.stop),
            n(&self.remove),
            n(&self.other),
        )
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The Plugin service: every answer empty.
struct Noop {
    calls: Calls,
    /// Cancelled by the runtime's Shutdown.
    shutdown: CancellationToken,
}

#[async_trait]
impl proto::Plugin for Noop {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        _req: ConfigureRequest,
    ) -> ttrpc::Result<ConfigureResponse> {
        bump(&self.calls.configure);
        let mut resp = ConfigureResponse::new();
        resp.events = event_mask(&SUBSCRIBED_EVENTS);
        Ok(resp)
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: SynchronizeRequest,
    ) -> ttrpc::Result<SynchronizeResponse> {
        bump(&self.calls.synchronize);
        let mut resp = SynchronizeResponse::new();
        // A split Synchronize (NRI v0.8+): each chunk but the last is acknowledged as such.
        resp.more = req.more;
        Ok(resp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: Empty) -> ttrpc::Result<Empty> {
        self.shutdown.cancel();
        Ok(Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        _req: CreateContainerRequest,
    ) -> ttrpc::Result<CreateContainerResponse> {
        bump(&self.calls.create);
        Ok(CreateContainerResponse::new())
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        _req: UpdateContainerRequest,
    ) -> ttrpc::Result<UpdateContainerResponse> {
        bump(&self.calls.update);
        Ok(UpdateContainerResponse::new())
    }
}

/// StopContainer and the state changes, decoded as the agent decodes them (`nri::lazy`).
#[async_trait]
impl LazyHooks for Noop {
    async fn stop_container(&self, _req: LazyStop) -> ttrpc::Result<StopContainerResponse> {
        bump(&self.calls.stop);
        Ok(StopContainerResponse::new())
    }

    async fn state_change(&self, req: LazyEvent) -> ttrpc::Result<Empty> {
        let c = &self.calls;
        bump(match req.event {
            Ok(Event::POST_START_CONTAINER) => &c.post_start,
            Ok(Event::POST_UPDATE_CONTAINER) => &c.post_update,
            Ok(Event::REMOVE_CONTAINER) => &c.remove,
            _ => &c.other,
        });
        Ok(Empty::new())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tap_bin_support::runtime(tap_bin_support::Threads::One)
        .context("starting the async runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: Args) -> Result<()> {
    let signal = tap_bin_support::shutdown_on_signal();
    let noop = Arc::new(Noop {
        calls: Calls::default(),
        shutdown: CancellationToken::new(),
    });
    let conn = Connection::open(&args.nri_socket, plugin_service(noop.clone())).await?;
    conn.register(&args.name, &args.index)
        .await
        .context("RegisterPlugin")?;
    eprintln!(
        "tap-nri-noop: registered as {}-{} on {}",
        args.index,
        args.name,
        args.nri_socket.display()
    );
    let closed = conn.closed();
    let why = tokio::select! {
        _ = signal.cancelled() => "signal",
        _ = noop.shutdown.cancelled() => "the runtime sent Shutdown",
        _ = closed.cancelled() => "the runtime closed the connection",
    };
    conn.close().await;
    println!("{}", noop.calls.line());
    eprintln!("tap-nri-noop: ended ({why})");
    Ok(())
}
