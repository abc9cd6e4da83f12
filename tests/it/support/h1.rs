//! HTTP/1.1 for the tests: an application serving each connection with
//! one handler, and a client on one connection.

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An HTTP/1.1 application on 127.0.0.1:0 answering every request with
/// `handler`; it serves until its task is aborted (or the test ends).
pub async fn serve_h1<F, Fut, B, E>(handler: F) -> (SocketAddr, JoinHandle<()>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<B>, E>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    E: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let addr = listener.local_addr().expect("app addr");
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service_fn(handler))
                    .await;
            });
        }
    });
    (addr, task)
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// An HTTP/1.1 client on its own connection to `addr`.
pub async fn h1_client(addr: SocketAddr) -> Sender {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}
