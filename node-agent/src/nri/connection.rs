//! One NRI connection as a plugin holds it: the Unix socket to the runtime, the multiplexer
//! over it ([`mux`]), our ttrpc server of a `Plugin` service on connection 1 and the
//! runtime's client on connection 2. The agent's sessions (`nri::run`) and the no-op
//! plugin of the start-path benchmark (`tap-nri-noop`, row (f) of docs/design/start-path.md) open it
//! the same way, so the benchmark measures the agent's own transport.

use super::{mux, proto};
use futures_util::StreamExt;
use proto::{RegisterPluginRequest, RuntimeClient};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, Service};

/// How long RegisterPlugin may take (the runtime's registration timeout is 5 s).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long closing waits for the ttrpc server's own shutdown.
const SERVER_SHUTDOWN: Duration = Duration::from_secs(3);

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("connecting to {socket}: {source}")]
    Connect {
        socket: String,
        source: std::io::Error,
    },
    #[error("internal: mux connections")]
    Mux,
    #[error("starting the ttrpc server: {0}")]
    Server(ttrpc::Error),
}

/// A plugin's connection to the runtime; [`Connection::close`] ends it.
pub struct Connection {
    trunk: mux::Mux,
    /// In a mutex only so that a `&Connection` may be held across an await in a task that
    /// moves between threads: the server's listener is `Send` but not `Sync`. Nothing locks it
    /// but [`Connection::close`].
    server: std::sync::Mutex<Server>,
    runtime: RuntimeClient,
}

impl Connection {
    /// Connects to the runtime's NRI socket and serves `services` (a plugin's
    /// [`super::lazy::plugin_service`]) before anything is registered: the runtime calls
    /// Configure as soon as it has the registration.
    pub async fn open(
        socket: &Path,
        services: HashMap<String, Service>,
    ) -> Result<Connection, OpenError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|source| OpenError::Connect {
                socket: socket.display().to_string(),
                source,
            })?;
        // Both logical connections exist before the first frame is read.
        let (trunk, mut conns) = mux::Mux::with_conns(
            stream,
            &[mux::PLUGIN_SERVICE_CONN, mux::RUNTIME_SERVICE_CONN],
        );
        let (Some(conn2), Some(conn1)) = (conns.pop(), conns.pop()) else {
            return Err(OpenError::Mux);
        };
        let listener = Listener::new(
            futures_util::stream::once(async move { Ok::<_, std::io::Error>(conn1) })
                .chain(futures_util::stream::pending()),
        );
        let mut server = Server::new()
            .register_service(services)
            .add_listener(listener);
        if let Err(e) = server.start().await {
            trunk.close();
            return Err(OpenError::Server(e));
        }
        let runtime = RuntimeClient::new(Client::new(Socket::new(conn2)));
        Ok(Connection {
            trunk,
            server: std::sync::Mutex::new(server),
            runtime,
        })
    }

    /// The runtime's service (RegisterPlugin, UpdateContainers).
    pub fn runtime(&self) -> &RuntimeClient {
        &self.runtime
    }

    /// Registers the plugin as `<idx>-<name>`.
    pub async fn register(&self, name: &str, idx: &str) -> ttrpc::Result<()> {
        let mut reg = RegisterPluginRequest::new();
        reg.plugin_name = name.to_string();
        reg.plugin_idx = idx.to_string();
        let ctx = ttrpc::context::with_timeout(REGISTER_TIMEOUT.as_nanos() as i64);
        self.runtime.register_plugin(ctx, &reg).await.map(|_| ())
    }

    /// Cancelled when the runtime closed the connection (or it broke).
    pub fn closed(&self) -> CancellationToken {
        self.trunk.closed()
    }

    /// Closes the trunk and shuts the server down (bounded).
    pub async fn close(self) {
        self.trunk.close();
        let mut server = self.server.into_inner().unwrap_or_else(|p| p.into_inner());
        let _ = tokio::time::timeout(SERVER_SHUTDOWN, server.shutdown()).await;
    }
}
