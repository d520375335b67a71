//! The web console, served on the TCP management listener only (a browser cannot reach the Unix
//! socket): one page, its style and its script, embedded in the binary (no CDN, works offline),
//! and the login that turns the API token into a cookie.
//!
//! The page is plain HTML, CSS and JavaScript with no build step and no library: it calls the
//! same `/api/v1` routes as the CLI and draws its charts as SVG itself. Its Content-Security-Policy
//! lets it load nothing but itself, run no inline script, and talk to nothing but this listener.
//! Over HTTPS (`--api-tls-certificates`) the login's cookie is `Secure`.

use super::api::ApiJson;
use super::api_token::{self, ApiToken};
use crate::api_types::{ApiError, ConsoleLogin};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;

/// The paths that answer without the token (see `tcp_api`): the page, what it loads, and the
/// login and logout themselves. Everything else on the listener needs it.
pub const PUBLIC_PATHS: &[&str] = &["/", "/console.js", "/charts.js", "/console.css", "/console/login", "/console/logout"];

const PAGE_HTML: &str = include_str!("console/index.html");
const SCRIPT_JS: &str = include_str!("console/console.js");
const CHARTS_JS: &str = include_str!("console/charts.js");
const STYLE_CSS: &str = include_str!("console/console.css");

/// Only this listener's own files and API; no inline script, no frames, no other origin.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// What the login and logout need: the token, and whether the listener speaks HTTPS.
#[derive(Clone)]
struct Login {
    token: Arc<ApiToken>,
    https: bool,
}

pub fn router(token: Arc<ApiToken>, https: bool) -> Router {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", PAGE_HTML) }))
        .route("/console.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT_JS) }))
        .route("/charts.js", get(|| async { asset("text/javascript; charset=utf-8", CHARTS_JS) }))
        .route("/console.css", get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .with_state(Login { token, https })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // A new binary may bring a new page: never run a stale script against a newer API.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `POST /console/login {"token": "..."}`: the right token answers 204 with the cookie that
/// carries it on every later request; a wrong one 401, and nothing is set.
async fn login(State(login): State<Login>, ApiJson(body): ApiJson<ConsoleLogin>) -> Response {
    if !login.token.matches(body.token.trim()) {
        let error = format!("that is not this daemon's API token; it is in {}", login.token.path().display());
        return (StatusCode::UNAUTHORIZED, Json(ApiError { error })).into_response();
    }
    with_cookie(StatusCode::NO_CONTENT, login.token.login_cookie(login.https))
}

/// `POST /console/logout`: the cookie expires.
async fn logout(State(login): State<Login>) -> Response {
    with_cookie(StatusCode::NO_CONTENT, api_token::logout_cookie(login.https))
}

fn with_cookie(status: StatusCode, cookie: String) -> Response {
    let mut response = status.into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(value) => drop(response.headers_mut().insert(header::SET_COOKIE, value)),
        // The token is hex, so the cookie is always a valid header value.
        Err(_) => *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR,
    }
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
