use super::*;

#[test]
fn every_route_resolves_to_itself() {
    let routes = routes();
    let r = Router::new(&routes, &pages()).unwrap();
    for def in &routes {
        let path = def
            .path
            .replace("{org}", "acme")
            .replace("{project}", "p1")
            .replace("{device_id}", "7")
            .replace("{group_id}", "8")
            .replace("{key_id}", "9")
            .replace("{session_id}", "10")
            .replace("{tag}", "t")
            .replace("{*path}", "dir/file.txt")
            .replace("{capsule_id}", "11")
            .replace("{config_id}", "12")
            .replace("{deployment_id}", "13")
            .replace("{repo_id}", "14")
            .replace("{run_id}", "15")
            .replace("{delivery_id}", "d")
            .replace("{token}", "tok");
        match r.resolve(&def.method, &path) {
            Resolved::Found(op, _, _) => assert_eq!(op, def.op, "{path}"),
            _ => panic!("{} {path} does not resolve", def.method),
        }
    }
}

#[test]
fn wrong_method_and_unknown_path() {
    let r = Router::new(&routes(), &pages()).unwrap();
    match r.resolve(&Method::PUT, "/api/v1/organizations") {
        Resolved::WrongMethod(allow) => assert_eq!(allow, "POST, GET"),
        _ => panic!(),
    }
    assert!(matches!(
        r.resolve(&Method::GET, "/api/v1/nope"),
        Resolved::NotFound
    ));
    match r.resolve(
        &Method::GET,
        "/api/v1/organizations/acme/projects/p/devices/3",
    ) {
        Resolved::Found(Op::GetDevice, _, params) => {
            assert_eq!(params[0], ("org".into(), "acme".into()));
            assert_eq!(params[2], ("device_id".into(), "3".into()));
        }
        _ => panic!(),
    }
}

#[test]
fn every_page_resolves_to_itself() {
    let r = Router::new(&routes(), &pages()).unwrap();
    for def in pages() {
        let path = def
            .path
            .replace("{org}", "acme")
            .replace("{project}", "p1")
            .replace("{id}", "7")
            .replace("{action}", "pause")
            .replace("{device}", "8")
            .replace("{*path}", "dir/file.txt");
        match r.page(&def.method, &path) {
            Some((page, _)) => assert_eq!(page, def.page, "{path}"),
            None => panic!("{} {path} is not a page", def.method),
        }
    }
    assert_eq!(r.page(&Method::GET, "/console/acme/p1/nope"), None);
    assert_eq!(r.page(&Method::DELETE, "/console/login"), None);
    // HEAD is not a page's method (the console answers it with its 404 page).
    assert_eq!(r.page(&Method::HEAD, "/console"), None);
    let (page, params) = r
        .page(&Method::GET, "/console/acme/p1/sessions/4/files")
        .unwrap();
    assert_eq!(page, Page::SessionFile);
    assert!(params.iter().all(|(k, _)| k != "path"));
    let (_, params) = r
        .page(
            &Method::GET,
            "/console/acme/p1/sessions/4/files/a%20b/c.txt",
        )
        .unwrap();
    assert_eq!(params[3], ("path".into(), "a%20b/c.txt".into()));
    assert_eq!(r.page(&Method::GET, "/").map(|p| p.0), Some(Page::Root));
    let (page, params) = r
        .page(
            &Method::POST,
            "/console/acme/p1/deployments/3/rollout/devices/9/retry",
        )
        .unwrap();
    assert_eq!(page, Page::RetryDevice);
    assert_eq!(params[2], ("id".into(), "3".into()));
    assert_eq!(params[3], ("device".into(), "9".into()));
}
