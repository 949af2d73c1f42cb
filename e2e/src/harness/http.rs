//! Plain HTTP/1.0 GETs to loopback services (Prometheus, the controller's /readyz), and the
//! Prometheus query API on top of them.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

/// An `http://host:port[/prefix]` base URL split into its address and path prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseUrl {
    pub authority: String,
    pub prefix: String,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<BaseUrl, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!(
                "{url:?}: only plain http:// URLs are supported (port-forward an https endpoint)"
            )
        })?;
        let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(format!("{url:?} has no host"));
        }
        let authority = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let prefix = prefix.trim_end_matches('/');
        Ok(BaseUrl {
            authority,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("/{prefix}")
            },
        })
    }

    /// GET `path_and_query` under the prefix: (status, body).
    pub fn get(&self, path_and_query: &str) -> Result<(u16, String), String> {
        get(&self.authority, &format!("{}{path_and_query}", self.prefix))
    }

    /// A Prometheus instant query: `data.result` of a successful reply.
    pub fn query(&self, promql: &str) -> Result<Value, String> {
        let (status, body) =
            self.get(&format!("/api/v1/query?query={}", percent_encode(promql)))?;
        let mut reply: Value = serde_json::from_str(&body)
            .map_err(|e| format!("query {promql:?}: HTTP {status}, not JSON ({e}): {body}"))?;
        if status == 200 && reply["status"] == "success" {
            Ok(reply["data"]["result"].take())
        } else {
            Err(format!("query {promql:?}: HTTP {status}: {body}"))
        }
    }

    /// The values of an instant query's vector result.
    pub fn values(&self, promql: &str) -> Result<Vec<f64>, String> {
        let result = self.query(promql)?;
        Ok(result
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|sample| sample["value"][1].as_str()?.parse().ok())
            .collect())
    }
}

/// GET `path` from `authority` (host:port): (status, body).
pub fn get(authority: &str, path: &str) -> Result<(u16, String), String> {
    let address = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    let io = |e: std::io::Error| format!("GET http://{authority}{path}: {e}");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").map_err(io)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(io)?;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET http://{authority}{path}: a malformed reply"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET http://{authority}{path}: no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_keep_their_prefix_and_default_port() {
        assert_eq!(
            BaseUrl::parse("http://127.0.0.1:9090").expect("valid"),
            BaseUrl {
                authority: "127.0.0.1:9090".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            BaseUrl::parse("http://prom.example/prometheus/").expect("valid"),
            BaseUrl {
                authority: "prom.example:80".into(),
                prefix: "/prometheus".into()
            }
        );
        let error = BaseUrl::parse("https://prom.example").expect_err("https is not spoken");
        assert!(error.contains("only plain http://"), "{error}");
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            percent_encode("rate(x{a=\"b\"}[5s])"),
            "rate%28x%7Ba%3D%22b%22%7D%5B5s%5D%29"
        );
    }
}
