//! Query strings: decoded pairs and the typed readers every list uses (422 naming the
//! parameter when a value does not fit).

use fleetops_actors::views::PageReq;

use crate::error::{ApiError, ApiResult};

#[derive(Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Drops parameters given empty (a form's untouched fields).
    pub fn drop_empty(&mut self) {
        self.0.retain(|(_, v)| !v.is_empty());
    }

    pub fn parse(q: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    pub fn u64(&self, k: &str) -> ApiResult<Option<u64>> {
        self.get(k)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::unprocessable(format!("{k}: must be a non-negative integer"))
                })
            })
            .transpose()
    }

    /// `page` (1-based, default 1) and `page_size` (1 to 500, default 50).
    pub fn page(&self) -> ApiResult<PageReq> {
        let mut p = PageReq::default();
        if let Some(v) = self.u64("page")? {
            if v < 1 {
                return Err(ApiError::unprocessable("page: must be at least 1"));
            }
            p.page = v as usize;
        }
        if let Some(v) = self.u64("page_size")? {
            if v < 1 || v as usize > PageReq::MAX_PAGE_SIZE {
                return Err(ApiError::unprocessable(format!(
                    "page_size: must be between 1 and {}",
                    PageReq::MAX_PAGE_SIZE
                )));
            }
            p.page_size = v as usize;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages() {
        let q = Query::parse(Some("page=2&page_size=10&name=a%20b"));
        let p = q.page().unwrap();
        assert_eq!((p.page, p.page_size), (2, 10));
        assert_eq!(q.get("name"), Some("a b"));
        assert!(Query::parse(Some("page=0")).page().is_err());
        assert!(Query::parse(Some("page_size=501")).page().is_err());
        assert!(Query::parse(Some("page=x")).page().is_err());
        let d = Query::parse(None).page().unwrap();
        assert_eq!((d.page, d.page_size), (1, 50));
    }
}
