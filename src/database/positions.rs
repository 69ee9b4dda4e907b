//! Each instance's WAL position, read from its manager's status endpoint
//! (`dbop_contract::position`) while a pass observes a Database with standbys: a failover
//! promotes the standby that received the most WAL (`roles`), and the status shows every
//! instance's position and lag. From the same endpoint, how full each instance's data volume
//! is (`dbop_contract::volume`), for `spec.storage.autoGrow`.
//!
//! I/O: one short HTTP/1.1 GET per pod, all at once, each bounded by `READ_WITHIN`. A pod that
//! does not answer (no IP yet, a manager that predates the endpoint, a lost node, a
//! NetworkPolicy in the way) has no position: it is left out, never guessed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use dbop_contract::position::{Position, STATUS_PATH, STATUS_PORT};
use dbop_contract::volume::{VOLUME_PATH, VolumeUsage};
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

/// How long one pod's answer may take, connection included. The manager answers from one short
/// query, but it starts a psql for it: on a loaded 2-core machine 0.8 s was too little, and a
/// synchronous failover, which needs the positions of enough standbys, kept waiting while the
/// primary came back. A pod that takes longer is as good as silent (a failover pass must not
/// wait long for a lost node's).
pub const READ_WITHIN: Duration = Duration::from_secs(2);
/// The largest answer read (a report is about 120 bytes).
const MAX_ANSWER: u64 = 16 * 1024;

/// The positions of the pods that answered, by pod name.
pub async fn read(pods: &[Pod]) -> BTreeMap<String, Position> {
    read_at(pods, STATUS_PORT, STATUS_PATH, Position::from_json).await
}

/// How full each answering pod's data volume is, by pod name (`GET /volume`, answered from
/// the filesystem, with or without a running server).
pub async fn volumes(pods: &[Pod]) -> BTreeMap<String, VolumeUsage> {
    read_at(pods, STATUS_PORT, VOLUME_PATH, VolumeUsage::from_json).await
}

async fn read_at<T>(
    pods: &[Pod],
    port: u16,
    path: &'static str,
    parse: fn(&str) -> Result<T, String>,
) -> BTreeMap<String, T> {
    let reads = pods.iter().filter_map(|pod| {
        let name = pod.metadata.name.clone()?;
        let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
        Some(async move {
            let answer = tokio::time::timeout(READ_WITHIN, get(ip, port, path)).await;
            match answer.map(|a| a.and_then(|body| parse(&body))) {
                Ok(Ok(report)) => Some((name, report)),
                Ok(Err(error)) => {
                    debug!(pod = %name, %error, "no answer at {path}");
                    None
                }
                Err(_) => {
                    debug!(pod = %name, "no answer at {path} within {READ_WITHIN:?}");
                    None
                }
            }
        })
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The body of `GET path` from the manager at `ip`.
async fn get(ip: IpAddr, port: u16, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect((ip, port))
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    body_of(&String::from_utf8_lossy(&answer)).map(str::to_string)
}

/// The body of a complete HTTP answer; any status but 200 is an error that says why.
fn body_of(answer: &str) -> Result<&str, String> {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or("an incomplete answer")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("{status}: {}", body.trim()));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dbop_contract::position::Lsn;

    #[test]
    fn answers() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n\
                  {\"standby\":true,\"lsn\":\"0/3000148\",\"streaming\":true}";
        let position = Position::from_json(body_of(ok).unwrap()).unwrap();
        assert_eq!(position.lsn, Some(Lsn(0x3000148)));
        let down = "HTTP/1.1 503 Service Unavailable\r\n\r\nthe server is starting\n";
        assert_eq!(
            body_of(down).unwrap_err(),
            "HTTP/1.1 503 Service Unavailable: the server is starting"
        );
        assert!(body_of("HTTP/1.1 200 OK\r\n").is_err());
        assert!(Position::from_json(body_of("HTTP/1.1 200 OK\r\n\r\n<html>").unwrap()).is_err());
    }

    fn pod(name: &str, ip: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: ip.map(String::from),
            ..Default::default()
        });
        pod
    }

    /// The request a manager sees, and what is made of its answer; a pod without an IP is not
    /// asked, one that refuses the connection or never answers has no position.
    async fn read(pods: &[Pod], port: u16) -> BTreeMap<String, Position> {
        read_at(pods, port, STATUS_PATH, Position::from_json).await
    }

    #[tokio::test]
    async fn reads_who_answers_and_leaves_out_the_silent() {
        let manager = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = manager.local_addr().unwrap().port();
        let silent = tokio::net::TcpListener::bind("127.0.0.2:0").await;
        let serve = tokio::spawn(async move {
            let (mut conn, _) = manager.accept().await.unwrap();
            let mut head = vec![0u8; 1024];
            let n = conn.read(&mut head).await.unwrap();
            let body = r#"{"standby":true,"timeline":1,"lsn":"0/5000000","streaming":true}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head[..n]).into_owned()
        });
        let pods = [
            pod("orders-0", Some("127.0.0.1")),
            pod("orders-1", None),
            // Nothing listens at this port on this address: refused at once.
            pod("orders-2", Some("127.0.0.3")),
            pod("orders-3", Some("not an address")),
        ];
        let positions = read(&pods, port).await;
        assert_eq!(positions.keys().collect::<Vec<_>>(), ["orders-0"]);
        assert_eq!(positions["orders-0"].lsn, Some(Lsn(0x5000000)));
        let request = serve.await.unwrap();
        assert!(request.starts_with("GET /status HTTP/1.1\r\n"), "{request}");
        // A pod that accepts but never answers is given up on after READ_WITHIN.
        if let Ok(silent) = silent {
            let port = silent.local_addr().unwrap().port();
            let started = std::time::Instant::now();
            assert!(
                read(&[pod("orders-4", Some("127.0.0.2"))], port)
                    .await
                    .is_empty()
            );
            assert!(started.elapsed() >= READ_WITHIN);
            drop(silent);
        }
    }
}
