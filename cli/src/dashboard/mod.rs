//! `kubectl rollouts dashboard`: a web page of every Rollout in scope, each Rollout's revision
//! tree, steps, conditions and events, its analysis measurements plotted, and the plugin's
//! actions behind buttons. It runs with the user's own kubeconfig credentials, so the page can
//! do what the user may do and nothing more, and listens on loopback unless told otherwise.
//!
//! The store keeps the watched objects; pages are drawn on the server from it ([`pages`],
//! [`chart`]); a page's script listens to a server-sent event stream ([`sse`]) fed by the
//! store's changes, so pages update without reloading or polling.

pub mod actions;
pub mod chart;
pub mod pages;
pub mod server;
pub mod sse;
pub mod store;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use server::Dashboard;
use store::{Scope, Store};

/// `dashboard` arguments (`-n` is kubectl's namespace flag).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 3100)]
    pub port: u16,
    /// Address to listen on; anything but loopback lets others on the network use your
    /// credentials through the page.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub address: IpAddr,
    /// Show Rollouts of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// The `Host` headers a loopback dashboard answers (others could be a DNS-rebinding page).
fn allowed_hosts(address: SocketAddr) -> Option<Vec<String>> {
    if !address.ip().is_loopback() {
        return None;
    }
    let port = address.port();
    Some(vec![
        address.to_string(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ])
}

/// Watches the Rollouts in scope and serves the dashboard until the process is stopped.
pub async fn run(cluster: Cluster, args: &Args) -> Result<()> {
    let scope = if args.all_namespaces {
        Scope::All
    } else {
        Scope::Namespace(cluster.namespace.clone())
    };
    let wanted = SocketAddr::new(args.address, args.port);
    let listener = TcpListener::bind(wanted).await.map_err(|e| {
        Error::Invalid(format!(
            "dashboard: cannot listen on {wanted}: {e} (fix: pass another --port or --address)"
        ))
    })?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::Invalid(format!("dashboard: cannot tell the bound address: {e}")))?;
    let store = Arc::new(Store::new());
    tokio::spawn(Arc::clone(&store).watch(cluster.client.clone(), scope.clone()));
    let dashboard = Arc::new(Dashboard {
        store,
        client: cluster.client.clone(),
        server: cluster.server.clone(),
        allowed_hosts: allowed_hosts(address),
        row_cache: Default::default(),
    });
    let shown = match &scope {
        Scope::All => "all namespaces".to_string(),
        Scope::Namespace(ns) => format!("namespace {ns}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Dashboard of {shown}: http://{address}/ (Ctrl-C to stop)"
    )
    .and_then(|()| out.flush())
    .map_err(|e| Error::Output(e.to_string()))?;
    drop(out);
    server::serve(listener, dashboard)
        .await
        .map_err(|e| Error::Invalid(format!("dashboard: the listener on {address} failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_dashboard_answers_only_its_own_host_names() {
        let hosts = allowed_hosts("127.0.0.1:3100".parse().expect("address")).expect("loopback");
        assert!(hosts.contains(&"localhost:3100".to_string()));
        assert!(hosts.contains(&"127.0.0.1:3100".to_string()));
        assert!(!hosts.iter().any(|h| h.contains("evil")));
        assert_eq!(
            allowed_hosts("0.0.0.0:3100".parse().expect("address")),
            None
        );
    }
}
