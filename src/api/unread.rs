//! An answer sent before its request's body was read to the end (a body over
//! the limit, a gzip bomb, a line refused halfway) says `Connection: close`.
//! hyper closes such a connection after the answer, since the rest of the
//! body is still on the wire, but does not say so: a client that pooled the
//! connection sends its next request into a closing socket and sees it fail
//! (`IncompleteMessage`, "connection reset"). Saying it lets every client
//! open a new connection instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};

/// The middleware: watches the body and marks the answer when it was left
/// unread.
pub async fn close_after_unread_body(req: Request, next: Next) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let done = Arc::new(AtomicBool::new(false));
    let watched = done.clone();
    let req = req.map(|inner| {
        Body::new(Watched {
            inner,
            done: watched,
        })
    });
    let mut response = next.run(req).await;
    if !done.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records having been read to its end.
struct Watched {
    inner: Body,
    done: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.done.store(true, Ordering::Release),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => {
                self.done.store(true, Ordering::Release);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route(
                "/read",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .route("/ignore", post(|| async { "not read" }))
            .layer(axum::middleware::from_fn(close_after_unread_body))
    }

    async fn connection_header(path: &str, body: &'static str) -> Option<String> {
        let request = Request::post(path)
            .body(Body::from(body))
            .expect("a request");
        let response = app().oneshot(request).await.expect("an answer");
        response
            .headers()
            .get(header::CONNECTION)
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    }

    #[tokio::test]
    async fn an_answer_leaving_the_body_unread_closes_the_connection() {
        assert_eq!(
            connection_header("/ignore", "some bytes").await.as_deref(),
            Some("close")
        );
    }

    #[tokio::test]
    async fn an_answer_after_reading_the_body_or_to_no_body_keeps_it() {
        assert_eq!(connection_header("/read", "some bytes").await, None);
        assert_eq!(connection_header("/ignore", "").await, None);
    }
}
