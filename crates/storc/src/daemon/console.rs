//! The web console, served on the TCP management listener only (a browser cannot reach the Unix
//! socket): so far, the login that turns the API token into a cookie.

use super::api::ApiJson;
use super::api_token::{self, ApiToken};
use crate::api_types::{ApiError, ConsoleLogin};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use std::sync::Arc;

/// The paths that answer without the token (see `tcp_api`): the login and logout themselves.
/// Everything else on the listener needs it.
pub const PUBLIC_PATHS: &[&str] = &["/console/login", "/console/logout"];

pub fn router(token: Arc<ApiToken>) -> Router {
    Router::new().route("/console/login", post(login)).route("/console/logout", post(logout)).with_state(token)
}

/// `POST /console/login {"token": "..."}`: the right token answers 204 with the cookie that
/// carries it on every later request; a wrong one 401, and nothing is set.
async fn login(State(token): State<Arc<ApiToken>>, ApiJson(body): ApiJson<ConsoleLogin>) -> Response {
    if !token.matches(body.token.trim()) {
        let error = format!("that is not this daemon's API token; it is in {}", token.path().display());
        return (StatusCode::UNAUTHORIZED, Json(ApiError { error })).into_response();
    }
    with_cookie(StatusCode::NO_CONTENT, token.login_cookie())
}

/// `POST /console/logout`: the cookie expires.
async fn logout() -> Response {
    with_cookie(StatusCode::NO_CONTENT, api_token::logout_cookie())
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
