//! The DTOs of the web console's routes: `POST /console/login`.

use serde::{Deserialize, Serialize};

/// `POST /console/login`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsoleLogin {
    pub token: String,
}
