//! Signing in and out: the signed-in user of a request (its cookie, refreshed when due, the
//! page charged to its rate limit), forms checked for origin, role and CSRF token before
//! their body is read.

use super::*;

/// The signed-in user of a page, and the cookie that refreshes the sign-in when due.
pub(super) struct Signed {
    pub(super) principal: Principal,
    pub(super) token: String,
    pub(super) email: String,
    /// The CSRF token of this sign-in (stable across refreshes).
    pub(super) csrf: String,
    pub(super) refresh: Option<String>,
}

impl Signed {
    /// A project page drawn inside this sign-in's chrome: 200, with the refreshed cookie
    /// when one is due.
    pub(super) fn page(
        &self,
        org: &str,
        project: &str,
        draw: impl FnOnce(&Chrome) -> Markup,
    ) -> Response<Body> {
        html(
            StatusCode::OK,
            draw(&self.chrome(Some((org, project)))),
            self.refresh.clone(),
        )
    }

    pub(super) fn chrome<'a>(&'a self, project: Option<(&'a str, &'a str)>) -> Chrome<'a> {
        Chrome {
            email: &self.email,
            csrf: &self.csrf,
            project,
        }
    }
}

/// Whether the request came over TLS (through a trusted proxy: fleetops itself speaks
/// plain HTTP), so the cookie is `Secure`.
pub(super) fn secure(app: &App, req: &Req) -> bool {
    req.from_trusted_proxy(&app.cfg.trusted_proxies)
        && req
            .header("x-forwarded-proto")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The sign-in of the request, or `None` (the page redirects to sign-in). A token past half
/// its life is exchanged for a new one, as the API's refresh does (within its window). Every
/// page is charged to the user's bucket under the organization's rate limit, as the API is.
pub(super) fn signed(app: &App, req: &Req) -> Result<Option<Signed>, ApiError> {
    let Some(token) = cookie::token(req.header("cookie")).map(str::to_string) else {
        return Ok(None);
    };
    let Ok(p) = app.rt.auth.resolve(&token) else {
        return Ok(None);
    };
    if !matches!(p.credential, fleetops_actors::auth::Credential::Jwt { .. }) {
        return Ok(None);
    }
    let Some(email) = p.user.as_ref().map(|u| u.email.clone()) else {
        return Ok(None);
    };
    // The organization a page is about (`/console/{org}/...`) sets the tier, as on the API.
    let org = req
        .parts
        .uri
        .path()
        .strip_prefix("/console/")
        .and_then(|r| r.split('/').next())
        .filter(|o| !o.is_empty() && *o != "login" && *o != "logout" && *o != "assets");
    let (tier, org_id) = app.rt.access.tier_for(&p, org)?;
    let charged = app.limits.check(
        &tier,
        crate::rate_limit::Bucket {
            caller: p.caller(),
            org_id,
        },
    );
    let rate = match &charged {
        Ok(h) | Err((_, h)) => *h,
    };
    let _ = RATE.try_with(|c| c.set(Some(rate)));
    charged.map_err(|(e, _)| e)?;
    let csrf = app.rt.auth.csrf_token(&p).unwrap_or_default();
    let ttl = app.rt.auth.token_ttl_seconds();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut out = Signed {
        principal: p,
        token,
        email,
        csrf,
        refresh: None,
    };
    if app
        .rt
        .auth
        .issued_at(&out.token)
        .is_some_and(|iat| cookie::needs_refresh(iat, now, ttl))
        && let Ok(t) = app.rt.auth.refresh(&out.principal)
    {
        out.refresh = Some(cookie::set(&t.access_token, t.expires_in, secure(app, req)));
        out.token = t.access_token;
    }
    Ok(Some(out))
}

/// A project page's signed-in user and their scope in the project (at least `min`); `None`
/// when the page should send to sign-in.
pub(super) fn project_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    min: Role,
) -> Result<Option<(Signed, fleetops_actors::ProjectScope)>, ApiError> {
    let Some(s) = signed(app, req)? else {
        return Ok(None);
    };
    let scope = app.rt.access.project(&s.principal, org, project, min)?;
    Ok(Some((s, scope)))
}

pub(super) fn to_login() -> Response<Body> {
    redirect("/console/login", None)
}

pub(super) async fn login(app: &App, mut req: Req) -> Result<Response<Body>, ApiError> {
    let ip = req.client_ip(&app.cfg.trusted_proxies);
    // As the API's login: one in-flight slot per address, and the per-address limit.
    let _slot = app.edge.per_address(ip)?;
    app.limits.check_login(ip)?;
    // A sign-in posted from another site's page (login CSRF) is refused.
    if !origin_matches(app, &req, false) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    let bytes = req.body_bytes(FORM_LIMIT).await?;
    let (email, password) = form2(&bytes, "email", "password");
    app.limits.check_login_account(&email)?;
    match app.rt.auth.login(&email, &password).await {
        Ok(t) => Ok(redirect(
            "/console",
            Some(cookie::set(
                &t.access_token,
                t.expires_in,
                secure(app, &req),
            )),
        )),
        Err(fleetops_actors::Error::Unauthorized) => Ok(html(
            StatusCode::UNAUTHORIZED,
            pages::login(Some("Wrong e-mail or password.")),
            None,
        )),
        Err(e) => Err(ApiError::Domain(e)),
    }
}

/// A form that changes something: its CSRF field must be this sign-in's, and a browser's
/// `Origin`, when sent, must be this console's.
pub(super) async fn checked_form(
    app: &App,
    req: &mut Req,
) -> Result<Option<(Signed, Bytes)>, ApiError> {
    Ok(checked_form_for(app, req, |_| Ok(()))
        .await?
        .map(|(s, (), b)| (s, b)))
}

/// As [`checked_form`], with `allowed` (a role check) run before the body is read, so a
/// caller without the role is told 403 whatever the body's size, as on the API.
pub(super) async fn checked_form_for<T>(
    app: &App,
    req: &mut Req,
    allowed: impl FnOnce(&Signed) -> Result<T, ApiError>,
) -> Result<Option<(Signed, T, Bytes)>, ApiError> {
    let Some(s) = signed(app, req)? else {
        return Ok(None);
    };
    if !origin_matches(app, req, false) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    let t = allowed(&s)?;
    let bytes = req.body_bytes(FORM_LIMIT).await?;
    let given = form1(&bytes, "csrf");
    if !cookie::csrf_ok(&s.csrf, given.as_deref()) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    Ok(Some((s, t, bytes)))
}

/// A project form a member posts (a rollout action, a retry, a backtest): the sign-in, the
/// project's scope and the body, checked as [`checked_form_for`] checks them.
pub(super) async fn member_form(
    app: &App,
    req: &mut Req,
    org: &str,
    project: &str,
) -> Result<Option<(Signed, fleetops_actors::ProjectScope, Bytes)>, ApiError> {
    checked_form_for(app, req, |s: &Signed| {
        Ok(app
            .rt
            .access
            .project(&s.principal, org, project, Role::Member)?)
    })
    .await
}

/// Whether the request's `Origin` is this console's: the scheme (https when it came through
/// a trusted TLS proxy) and the `Host` the request names (a proxy must pass `Host` through).
/// Without an `Origin`, `required` decides; without a `Host`, no origin matches.
pub(super) fn origin_matches(app: &App, req: &Req, required: bool) -> bool {
    let Some(origin) = req.header("origin") else {
        return !required;
    };
    // HTTP/2 names the host in `:authority`, not in a `Host` header.
    let Some(host) = req
        .header("host")
        .or_else(|| req.parts.uri.authority().map(|a| a.as_str()))
    else {
        return false;
    };
    let scheme = if secure(app, req) { "https" } else { "http" };
    origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
}

/// Signs out for real: the sign-in the cookie's token descends from ends server-side (a
/// copy of the token is refused from now on, refreshes included), then the cookie goes.
pub(super) async fn logout(app: &App, mut req: Req) -> Result<Response<Body>, ApiError> {
    match checked_form(app, &mut req).await? {
        None => Ok(to_login()),
        Some((s, _)) => {
            app.rt.directory.sign_out(&s.principal).await?;
            Ok(redirect(
                "/console/login",
                Some(cookie::clear(secure(app, &req))),
            ))
        }
    }
}
