//! Response bodies read with a size cap: a provider's answer is read chunk by chunk and the
//! read stops as soon as it passes the cap, so one metric pointed at a huge (or endless) answer
//! costs the controller at most the cap in memory, never the whole body.

/// Bytes of a response body a provider reads when the controller is not told otherwise
/// (`--analysis-max-response-bytes`): 10 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 * 1024 * 1024;

/// Why a response body could not be had.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(
        "the response body is larger than the controller's limit of {cap} bytes: make the answer smaller (select less with the query or jsonPath) or raise --analysis-max-response-bytes"
    )]
    TooLarge { cap: usize },
    #[error("the response body could not be read: {source}")]
    Read {
        #[source]
        source: reqwest::Error,
    },
}

/// Reads `response`'s body, at most `cap` bytes. A `Content-Length` above the cap is refused
/// before anything is read; otherwise chunks are read until the body ends or passes the cap.
pub async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, BodyError> {
    let announced = response.content_length().unwrap_or(0);
    if u64::try_from(cap).is_ok_and(|cap| announced > cap) {
        return Err(BodyError::TooLarge { cap });
    }
    // Reserve for what is announced, never more than the cap or a modest first block.
    let reserve = usize::try_from(announced)
        .unwrap_or(cap)
        .min(cap)
        .min(64 * 1024);
    let mut body = Vec::with_capacity(reserve);
    loop {
        let chunk = response.chunk().await.map_err(|source| BodyError::Read {
            source: source.without_url(),
        })?;
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if chunk.len() > cap.saturating_sub(body.len()) {
            return Err(BodyError::TooLarge { cap });
        }
        body.extend_from_slice(&chunk);
    }
}
