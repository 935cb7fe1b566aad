//! Reading a LIST a page at a time: one piece for every caller that lists what may be large (a
//! leaf's pod metrics, this install's Nodes), so no answer holds all of it at once.

use std::future::Future;

use kube::api::{ListParams, ObjectList};

/// `params` for the page after `token` (the first page without one).
pub fn continued(params: &ListParams, token: Option<String>) -> ListParams {
    match token {
        Some(token) => params.clone().continue_token(&token),
        None => params.clone(),
    }
}

/// One page of a LIST: its items and the continue token of the next, if any.
pub type Page<T> = (Vec<T>, Option<String>);

/// Every item of a LIST, read page by page: `page` reads the page after a continue token (and
/// may keep only what it needs of it).
pub async fn paged<T, E, F, P>(mut page: P) -> Result<Vec<T>, E>
where
    P: FnMut(Option<String>) -> F,
    F: Future<Output = Result<Page<T>, E>>,
{
    let mut items = Vec::new();
    let mut token = None;
    loop {
        let (list, next) = page(token.take()).await?;
        items.extend(list);
        match next {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return Ok(items),
        }
    }
}

/// A kube LIST's page.
pub fn page_of<T: Clone>(list: ObjectList<T>) -> Page<T> {
    (list.items, list.metadata.continue_)
}
