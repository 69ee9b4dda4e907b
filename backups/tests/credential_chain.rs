//! The agent without a static key: AWS's standard credential chain, as the backup Jobs use it
//! when `spec.backup.s3.credentials` is absent. EKS Pod Identity (and ECS) hand a pod its
//! credentials from a container credentials endpoint, authorised by a token in a file; here
//! that endpoint is a loopback HTTP server of the test's, serving temporary credentials (with a
//! session token) that s3s-fs accepts. The dump succeeds only if the agent fetched them with
//! the token; a wrong token is refused and the backup fails with a clear message.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::*;
use dbop_contract::test_support::{S3_ACCESS_KEY, S3_SECRET_KEY};

const TOKEN: &str = "pod-identity-token-of-the-test";

/// A container credentials endpoint on loopback: answers with the s3s-fs key pair and a
/// session token when the Authorization header is `TOKEN`, 403 otherwise. Records what it saw.
fn credentials_endpoint() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/credentials", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut authorization = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("authorization")
                {
                    authorization = value.trim().to_string();
                }
            }
            record.lock().unwrap().push(authorization.clone());
            let (status, body) = if authorization == TOKEN {
                let expiration = (chrono::Utc::now() + chrono::Duration::hours(1))
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string();
                (
                    "200 OK",
                    format!(
                        r#"{{"AccessKeyId":"{S3_ACCESS_KEY}","SecretAccessKey":"{S3_SECRET_KEY}","Token":"session-token-of-the-test","Expiration":"{expiration}"}}"#
                    ),
                )
            } else {
                ("403 Forbidden", r#"{"message":"bad token"}"#.to_string())
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// The Job's environment with no static key: the endpoint and the token file instead.
fn chain_env(
    pg: &Pg,
    s3: &S3Server,
    url: &str,
    token_file: &std::path::Path,
) -> Vec<(String, String)> {
    let mut env = env_of(pg, "app", s3);
    env.retain(|(k, _)| {
        !matches!(
            k.as_str(),
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" | "AWS_EC2_METADATA_DISABLED"
        )
    });
    env.push(("AWS_CONTAINER_CREDENTIALS_FULL_URI".into(), url.into()));
    env.push((
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE".into(),
        token_file.display().to_string(),
    ));
    // No instance metadata on a test machine: the chain must not wait for it.
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    env
}

#[test]
fn without_a_static_key_the_agent_takes_container_credentials_with_their_token() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    fill_varied(&pg, "app", 200, 1);
    let (url, seen) = credentials_endpoint();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let run = agent(&["dump"], &chain_env(&pg, &s3, &url, &token_file));
    let result = run.ok();
    assert!(result.backup_id.is_some(), "{result:?}");
    assert!(
        seen.lock().unwrap().iter().any(|a| a == TOKEN),
        "the agent never asked the endpoint with the token: {:?}",
        seen.lock().unwrap()
    );
    // And restorable with the same chain: listed from the bucket.
    let list = agent(&["list"], &chain_env(&pg, &s3, &url, &token_file));
    assert_eq!(list.code, Some(0), "{}", list.stderr);

    // A token the endpoint refuses: no credentials, a failed backup that says so.
    std::fs::write(&token_file, "someone-elses-token").unwrap();
    let refused = agent(&["dump"], &chain_env(&pg, &s3, &url, &token_file));
    assert_ne!(
        refused.code,
        Some(0),
        "a backup without credentials succeeded"
    );
    let text = format!("{}{}", refused.stdout, refused.stderr);
    assert!(text.to_lowercase().contains("credential"), "{text}");
    assert!(
        !text.contains(S3_SECRET_KEY),
        "the secret key in the output: {text}"
    );
}
