//! Client of the status API over its unix socket (used by the CLI and the tests).

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use super::{ApiError, Status, UpdateResult};
use crate::model::{EventRecord, LinuxResources};

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the nri-resize API at {path}: {source} (is the daemon running? are you root?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("API transport error: {0}")]
    Http(#[from] hyper::Error),
    #[error("API request could not be built: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("API answered {status}: {message}")]
    Status { status: StatusCode, message: String },
    #[error("API answer is not the expected JSON: {0}")]
    Decode(#[from] serde_json::Error),
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ApiClient {
    socket: PathBuf,
}

impl ApiClient {
    pub fn new(socket: impl AsRef<Path>) -> Self {
        ApiClient {
            socket: socket.as_ref().to_path_buf(),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let conn_task = tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "nri-resize")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        conn_task.abort();
        Ok((status, bytes))
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.call(method, path, body).await?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ApiError>(&bytes).map_or_else(
                |_| String::from_utf8_lossy(&bytes).into_owned(),
                |e| e.error,
            );
            return Err(ClientError::Status { status, message });
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, ClientError> {
        Ok(serde_json::to_vec(v)?)
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        self.json(Method::GET, "/v1/status", None).await
    }

    pub async fn events(&self, since: u64) -> Result<Vec<EventRecord>, ClientError> {
        self.json(Method::GET, &format!("/v1/events?since={since}"), None)
            .await
    }

    pub async fn update_resources(
        &self,
        container_id: &str,
        resources: &LinuxResources,
    ) -> Result<UpdateResult, ClientError> {
        let path = format!("/v1/containers/{container_id}/resources");
        self.json(Method::POST, &path, Some(Self::encode(resources)?))
            .await
    }

    /// A whole-pod resize; returns when it finished.
    pub async fn resize_pod(
        &self,
        namespace: &str,
        name: &str,
        req: &crate::resize::PodResizeRequest,
    ) -> Result<crate::resize::PodResize, ClientError> {
        let path = format!("/v1/pods/{namespace}/{name}/resize");
        self.json(Method::POST, &path, Some(Self::encode(req)?))
            .await
    }

    /// Resize records of containers and pods.
    pub async fn resizes(&self) -> Result<super::Resizes, ClientError> {
        self.json(Method::GET, "/v1/resizes", None).await
    }

    /// `true` when `/readyz` answers 200.
    pub async fn ready(&self) -> Result<bool, ClientError> {
        let (status, _) = self.call(Method::GET, "/readyz", None).await?;
        Ok(status == StatusCode::OK)
    }
}
