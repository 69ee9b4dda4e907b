//! One replication connection, the I/O: the socket (TCP, or a Unix socket), TLS as `PGSSLMODE`
//! asks (`tls`), the startup with `replication=true`, the password (cleartext, MD5 or
//! SCRAM-SHA-256, bound to the TLS session as `PGCHANNELBINDING` says) from `PGPASSWORD` or
//! the pgpass file, the server's parameters, and the hosts
//! tried in turn as libpq tries them (`prefer-standby`: a standby first). After that, messages
//! in and simple queries out.

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, SCRAM_SHA_256, SCRAM_SHA_256_PLUS, ScramSha256,
};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::Socket;
use super::conninfo::{self, Address, Settings, SslMode, TargetSession, pgpass_password};
use super::tls;

/// The server versions whose `BASE_BACKUP` takes options in parentheses, server-side
/// compression and sends its archives in the new copy format.
pub const MIN_SERVER_VERSION_NUM: u32 = 150000;

const READ_BUFFER: usize = 256 << 10;

/// An open, authenticated replication connection.
pub struct Connection {
    socket: Box<dyn Socket>,
    buf: BytesMut,
    /// Where it went, for messages.
    pub address: Address,
    /// The server's `server_version`.
    pub server_version: String,
    pub standby: bool,
}

/// Connects to the first host that accepts (with `prefer-standby`, the first standby, else the
/// first host that accepts). The error says why each host was not used.
pub async fn connect(settings: &Settings) -> Result<Connection, String> {
    let mut why = Vec::new();
    let mut fallback: Option<Connection> = None;
    for address in &settings.addresses {
        match connect_one(settings, address).await {
            Ok(c) if settings.target == TargetSession::Any || c.standby => {
                if let Some(primary) = fallback.take() {
                    primary.close().await;
                }
                return Ok(c);
            }
            Ok(c) if fallback.is_none() => fallback = Some(c),
            Ok(c) => c.close().await,
            Err(e) => why.push(format!("{}:{}: {e}", address.host(), address.port())),
        }
    }
    fallback.ok_or_else(|| why.join("; "))
}

async fn connect_one(settings: &Settings, address: &Address) -> Result<Connection, String> {
    let open = open_socket(settings, address);
    let (socket, end_point) = match settings.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, open)
            .await
            .map_err(|_| "timeout expired".to_string())??,
        None => open.await?,
    };
    let mut conn = Connection {
        socket,
        buf: BytesMut::with_capacity(READ_BUFFER),
        address: address.clone(),
        server_version: String::new(),
        standby: false,
    };
    conn.startup(settings, end_point.as_deref()).await?;
    Ok(conn)
}

/// The socket, with TLS negotiated over TCP as the mode says, and the server certificate's
/// hash for channel binding when there is TLS.
async fn open_socket(
    settings: &Settings,
    address: &Address,
) -> Result<(Box<dyn Socket>, Option<Vec<u8>>), String> {
    if let Some(path) = address.socket_path() {
        let s = UnixStream::connect(&path)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
        return Ok((Box::new(s), None));
    }
    let (host, port) = (address.host(), address.port());
    let mut tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    tcp.set_nodelay(true).ok();
    if settings.ssl_mode == SslMode::Disable {
        return Ok((Box::new(tcp), None));
    }
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    tcp.write_all(&request).await.map_err(|e| e.to_string())?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    match (answer[0], settings.ssl_mode) {
        (b'S', _) => tls::wrap(tcp, host, settings).await,
        (b'N', SslMode::Prefer) => Ok((Box::new(tcp), None)),
        (b'N', _) => Err("the server does not support TLS, and sslmode requires it".into()),
        (other, _) => Err(format!("unexpected answer {other:#x} to the TLS request")),
    }
}

impl Connection {
    async fn startup(
        &mut self,
        settings: &Settings,
        end_point: Option<&[u8]>,
    ) -> Result<(), String> {
        let mut params = vec![("user", settings.user.as_str()), ("replication", "true")];
        if let Some(name) = &settings.application_name {
            params.push(("application_name", name.as_str()));
        }
        let mut out = BytesMut::new();
        frontend::startup_message(params, &mut out).map_err(|e| e.to_string())?;
        self.send(&out).await?;
        self.authenticate(settings, end_point).await?;
        let mut version_num = None;
        loop {
            match self.next().await? {
                Message::ParameterStatus(p) => {
                    let (name, value) = (p.name().unwrap_or(""), p.value().unwrap_or(""));
                    match name {
                        "server_version" => {
                            self.server_version = value.to_string();
                            version_num = version_num_of(value);
                        }
                        "in_hot_standby" => self.standby = value == "on",
                        _ => {}
                    }
                }
                Message::ReadyForQuery(_) => break,
                Message::BackendKeyData(_) | Message::NoticeResponse(_) => {}
                other => return Err(unexpected(&other)),
            }
        }
        match version_num {
            Some(n) if n >= MIN_SERVER_VERSION_NUM => Ok(()),
            _ => Err(format!(
                "PostgreSQL {} (this client needs 15 or later)",
                self.server_version
            )),
        }
    }

    async fn authenticate(
        &mut self,
        settings: &Settings,
        end_point: Option<&[u8]>,
    ) -> Result<(), String> {
        let require = settings.channel_binding == conninfo::ChannelBinding::Require;
        let mut scram: Option<ScramSha256> = None;
        let mut bound = false;
        loop {
            let mut out = BytesMut::new();
            match self.next().await? {
                Message::AuthenticationOk if require && !bound => {
                    return Err(UNBOUND_LOGIN.into());
                }
                Message::AuthenticationOk => return Ok(()),
                Message::AuthenticationCleartextPassword
                | Message::AuthenticationMd5Password(_)
                    if require =>
                {
                    return Err(UNBOUND_PASSWORD.into());
                }
                Message::AuthenticationCleartextPassword => {
                    let pw = self.password(settings)?;
                    frontend::password_message(pw.as_bytes(), &mut out)
                        .map_err(|e| e.to_string())?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let pw = self.password(settings)?;
                    let hash = md5_hash(settings.user.as_bytes(), pw.as_bytes(), body.salt());
                    frontend::password_message(hash.as_bytes(), &mut out)
                        .map_err(|e| e.to_string())?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut offered = Vec::new();
                    let mut mechanisms = body.mechanisms();
                    while let Some(m) = mechanisms.next().map_err(|e| e.to_string())? {
                        offered.push(m.to_string());
                    }
                    let (mechanism, binding) =
                        scram_mechanism(settings.channel_binding, &offered, end_point)?;
                    bound = mechanism == SCRAM_SHA_256_PLUS;
                    let pw = self.password(settings)?;
                    let s = ScramSha256::new(pw.as_bytes(), binding);
                    frontend::sasl_initial_response(mechanism, s.message(), &mut out)
                        .map_err(|e| e.to_string())?;
                    scram = Some(s);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let s = scram.as_mut().ok_or("SASL continue before SASL start")?;
                    s.update(body.data()).map_err(|e| format!("SCRAM: {e}"))?;
                    frontend::sasl_response(s.message(), &mut out).map_err(|e| e.to_string())?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let s = scram.as_mut().ok_or("SASL final before SASL start")?;
                    s.finish(body.data())
                        .map_err(|e| format!("SCRAM: the server's proof: {e}"))?;
                    continue;
                }
                other => return Err(unexpected(&other)),
            }
            self.send(&out).await?;
        }
    }

    /// `PGPASSWORD`, else the pgpass file's line for this host; never in a message.
    fn password(&self, settings: &Settings) -> Result<String, String> {
        if let Some(pw) = std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()) {
            return Ok(pw);
        }
        settings
            .password_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|text| pgpass_password(&text, &self.address, &settings.user))
            .ok_or_else(|| "the server asks for a password and none is supplied".into())
    }

    /// Sends one simple query.
    pub async fn query(&mut self, sql: &str) -> Result<(), String> {
        let mut out = BytesMut::new();
        frontend::query(sql, &mut out).map_err(|e| e.to_string())?;
        self.send(&out).await
    }

    /// The next message; an `ErrorResponse` is an error with the server's message.
    pub async fn next(&mut self) -> Result<Message, String> {
        loop {
            if let Some(m) = Message::parse(&mut self.buf).map_err(|e| e.to_string())? {
                return match m {
                    Message::ErrorResponse(body) => Err(server_error(body.fields())),
                    m => Ok(m),
                };
            }
            if self.buf.capacity() - self.buf.len() < 8 << 10 {
                self.buf.reserve(READ_BUFFER);
            }
            let n = self
                .socket
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| format!("reading from the server: {e}"))?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.socket
            .write_all(bytes)
            .await
            .map_err(|e| format!("writing to the server: {e}"))
    }

    /// Says goodbye (best effort).
    pub async fn close(mut self) {
        let mut out = BytesMut::new();
        frontend::terminate(&mut out);
        let _ = self.send(&out).await;
        let _ = self.socket.shutdown().await;
    }
}

const UNBOUND_PASSWORD: &str = "channel binding is required (PGCHANNELBINDING=require), but the server asked for a password without SCRAM; no password was sent";
const UNBOUND_LOGIN: &str = "channel binding is required (PGCHANNELBINDING=require), but the server let the client in without it";

/// The SASL mechanism and the channel binding, as libpq chooses them: SCRAM-SHA-256-PLUS
/// bound to the server certificate when the server offers it over TLS, unless binding is
/// disabled; otherwise SCRAM-SHA-256, saying `y` (the client could bind, the server did not
/// offer it) over TLS and `n` without a certificate to bind to. `require` takes nothing less.
fn scram_mechanism(
    wanted: conninfo::ChannelBinding,
    offered: &[String],
    end_point: Option<&[u8]>,
) -> Result<(&'static str, ChannelBinding), String> {
    use conninfo::ChannelBinding as Wanted;
    let offers = |m: &str| offered.iter().any(|o| o == m);
    match (wanted, end_point) {
        (Wanted::Disable, _) if offers(SCRAM_SHA_256) => {
            Ok((SCRAM_SHA_256, ChannelBinding::unsupported()))
        }
        (Wanted::Prefer | Wanted::Require, Some(hash)) if offers(SCRAM_SHA_256_PLUS) => Ok((
            SCRAM_SHA_256_PLUS,
            ChannelBinding::tls_server_end_point(hash.to_vec()),
        )),
        (Wanted::Require, _) => Err(format!(
            "channel binding is required (PGCHANNELBINDING=require), but the server offers {} {}",
            offered.join(", "),
            match end_point {
                Some(_) => "over TLS",
                None => "without a TLS certificate to bind to",
            }
        )),
        (Wanted::Prefer, Some(_)) if offers(SCRAM_SHA_256) => {
            Ok((SCRAM_SHA_256, ChannelBinding::unrequested()))
        }
        (Wanted::Prefer, None) if offers(SCRAM_SHA_256) => {
            Ok((SCRAM_SHA_256, ChannelBinding::unsupported()))
        }
        _ => Err(format!(
            "the server offers no SASL mechanism this client knows ({})",
            offered.join(", ")
        )),
    }
}

/// A CopyData message's payload without copying it.
pub fn copy_data(m: Message) -> Option<Bytes> {
    match m {
        Message::CopyData(body) => Some(body.into_bytes()),
        _ => None,
    }
}

/// `15.4 (Debian …)` → 150004; `16beta1` → 160000.
pub fn version_num_of(version: &str) -> Option<u32> {
    let digits = |s: &str| -> Option<u32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    };
    let major = digits(version)?;
    let minor = version
        .split_once('.')
        .and_then(|(_, rest)| digits(rest))
        .unwrap_or(0);
    Some(major * 10000 + minor)
}

fn server_error(mut fields: postgres_protocol::message::backend::ErrorFields<'_>) -> String {
    let (mut severity, mut message, mut detail) = (String::new(), String::new(), String::new());
    while let Ok(Some(f)) = fields.next() {
        match f.type_() {
            b'S' => severity = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'D' => detail = format!(" ({})", String::from_utf8_lossy(f.value_bytes())),
            _ => {}
        }
    }
    format!("{severity}: {message}{detail}")
}

pub fn unexpected(m: &Message) -> String {
    let name = match m {
        Message::RowDescription(_) => "RowDescription",
        Message::DataRow(_) => "DataRow",
        Message::CopyOutResponse(_) => "CopyOutResponse",
        Message::CopyData(_) => "CopyData",
        Message::CopyDone => "CopyDone",
        Message::CommandComplete(_) => "CommandComplete",
        Message::ReadyForQuery(_) => "ReadyForQuery",
        _ => "another message",
    };
    format!("unexpected {name} from the server")
}

#[cfg(test)]
mod tests {
    use super::*;
    use conninfo::ChannelBinding as Wanted;

    /// The mechanism chosen and the gs2 header its first message starts with, or the error.
    fn choose(wanted: Wanted, offered: &[&str], tls: bool) -> Result<(String, String), String> {
        let offered: Vec<String> = offered.iter().map(|m| m.to_string()).collect();
        let hash = [7u8; 32];
        let (mechanism, binding) = scram_mechanism(wanted, &offered, tls.then_some(&hash[..]))?;
        let first = ScramSha256::new(b"pw", binding).message().to_vec();
        let first = String::from_utf8(first).unwrap();
        let header = first.split("n=").next().unwrap().to_string();
        Ok((mechanism.to_string(), header))
    }

    #[test]
    fn scram_binds_the_channel_as_libpq_does() {
        let both = [SCRAM_SHA_256_PLUS, SCRAM_SHA_256];
        let plain = [SCRAM_SHA_256];
        let ok = |m: &str, h: &str| Ok((m.to_string(), h.to_string()));
        // Over TLS with PLUS offered: bound to the certificate, unless disabled.
        let bound = ok(SCRAM_SHA_256_PLUS, "p=tls-server-end-point,,");
        assert_eq!(choose(Wanted::Prefer, &both, true), bound);
        assert_eq!(choose(Wanted::Require, &both, true), bound);
        assert_eq!(
            choose(Wanted::Disable, &both, true),
            ok(SCRAM_SHA_256, "n,,")
        );
        // Over TLS without PLUS (a relay that dropped it, say): 'y', which a server that can
        // bind takes for the downgrade it is; require refuses before any password is sent.
        assert_eq!(
            choose(Wanted::Prefer, &plain, true),
            ok(SCRAM_SHA_256, "y,,")
        );
        let e = choose(Wanted::Require, &plain, true).unwrap_err();
        assert!(e.contains("required") && e.contains("over TLS"), "{e}");
        // No TLS: nothing to bind to.
        assert_eq!(
            choose(Wanted::Prefer, &plain, false),
            ok(SCRAM_SHA_256, "n,,")
        );
        let e = choose(Wanted::Require, &both, false).unwrap_err();
        assert!(e.contains("without a TLS certificate"), "{e}");
        // Nothing known offered.
        let e = choose(Wanted::Prefer, &["OAUTHBEARER"], true).unwrap_err();
        assert!(e.contains("OAUTHBEARER"), "{e}");
    }

    #[test]
    fn server_versions_read_as_libpq_numbers_them() {
        assert_eq!(
            version_num_of("15.4 (Debian 15.4-2.pgdg120+1)"),
            Some(150004)
        );
        assert_eq!(version_num_of("17.2"), Some(170002));
        assert_eq!(version_num_of("16beta1"), Some(160000));
        assert_eq!(version_num_of("garbage"), None);
    }
}
