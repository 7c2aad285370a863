//! What the viewer may read and do, asked by SubjectAccessReview (the
//! answers remembered for [`REVIEW_TTL`]), and the inventory a page shows
//! them.

use super::*;

/// One remembered SubjectAccessReview: a session's user, an [`Access`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Decision {
    session: session::Key,
    verb: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Decision {
    pub(super) fn of(session: session::Key, a: Access<'_>) -> Decision {
        Decision {
            session,
            verb: a.verb.into(),
            resource: a.resource.into(),
            namespace: a.namespace.map(Into::into),
            name: a.name.map(Into::into),
        }
    }
}

/// The kinds a page is about.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Cluster,
    Machine,
    Operation,
}

impl Kind {
    pub(super) fn resource(self) -> &'static str {
        match self {
            Kind::Cluster => "talosclusters",
            Kind::Machine => "talosmachines",
            Kind::Operation => "talosoperations",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "TalosCluster",
            Kind::Machine => "TalosMachine",
            Kind::Operation => "TalosOperation",
        }
    }

    fn exists(self, inv: &Inventory, ns: &str, name: &str) -> bool {
        fn has<K: kube::Resource>(items: &[Arc<K>], ns: &str, name: &str) -> bool {
            items
                .iter()
                .any(|o| o.namespace().as_deref() == Some(ns) && o.name_any() == name)
        }
        match self {
            Kind::Cluster => has(&inv.clusters, ns, name),
            Kind::Machine => has(&inv.machines, ns, name),
            Kind::Operation => has(&inv.operations, ns, name),
        }
    }

    fn readable(self, grants: &mut ReadGrants) -> &mut Readable {
        match self {
            Kind::Cluster => &mut grants.clusters,
            Kind::Machine => &mut grants.machines,
            Kind::Operation => &mut grants.operations,
        }
    }
}

/// One object's page: what its viewer may see of the inventory and do.
pub(super) struct Detail {
    pub(super) who: Who,
    pub(super) inventory: Inventory,
    pub(super) perms: Permissions,
}

impl AppState {
    /// Whether the signed-in user may do `access` (remembered for [`REVIEW_TTL`]).
    async fn decide(&self, who: &SignedIn, access: Access<'_>) -> Result<bool, Response> {
        let key = Decision::of(who.key, access);
        if let Some(answer) = lock(&self.shared.decisions).get(&key, Instant::now()) {
            return Ok(answer);
        }
        let answer = auth::may(&self.client, &who.user, access)
            .await
            .map_err(|e| api_failure(&e))?;
        lock(&self.shared.decisions).insert(key, answer, Instant::now());
        Ok(answer)
    }

    /// Where the user may list `resource`: everywhere, or which of `namespaces`.
    async fn readable(
        &self,
        who: &SignedIn,
        resource: &'static str,
        namespaces: &BTreeSet<String>,
    ) -> Result<Readable, Response> {
        fn list<'a>(resource: &'a str, namespace: Option<&'a str>) -> Access<'a> {
            Access {
                verb: "list",
                resource,
                namespace,
                name: None,
            }
        }
        if self.decide(who, list(resource, None)).await? {
            return Ok(Readable::Everywhere);
        }
        let namespaces: Vec<&String> = namespaces.iter().collect();
        let mut allowed = BTreeSet::new();
        for chunk in namespaces.chunks(REVIEWS_AT_ONCE) {
            let asks = chunk
                .iter()
                .map(|ns| self.decide(who, list(resource, Some(ns.as_str()))));
            let answers = futures::future::try_join_all(asks).await?;
            for (ns, ok) in chunk.iter().zip(answers) {
                if ok {
                    allowed.insert((*ns).clone());
                }
            }
        }
        Ok(Readable::In(allowed))
    }

    /// What the viewer may read of the kinds, asked for the namespaces
    /// given per kind (clusters, machines, operations).
    async fn read_grants(
        &self,
        who: &Who,
        [clusters, machines, operations]: &[BTreeSet<String>; 3],
    ) -> Result<ReadGrants, Response> {
        let Who::User(u) = who else {
            return Ok(ReadGrants::everything());
        };
        let (clusters, machines, operations) = futures::try_join!(
            self.readable(u, Kind::Cluster.resource(), clusters),
            self.readable(u, Kind::Machine.resource(), machines),
            self.readable(u, Kind::Operation.resource(), operations),
        )?;
        Ok(ReadGrants {
            clusters,
            machines,
            operations,
        })
    }

    /// A list page's inventory: the cache, filtered by what the viewer may
    /// list; and whether that hides every object there is.
    pub(super) async fn list_page(
        &self,
        caller: &Caller,
    ) -> Result<(Who, Inventory, bool), Response> {
        let who = self.who(caller).await?;
        let inv = self.cache.inventory();
        let grants = self.read_grants(&who, &view::namespaces(&inv)).await?;
        let any =
            !(inv.clusters.is_empty() && inv.machines.is_empty() && inv.operations.is_empty());
        Ok((
            who,
            view::visible(&inv, &grants),
            any && grants.reads_nothing(),
        ))
    }

    /// One object's page. An object the cache does not hold costs no review
    /// (a made-up URL asks the API server nothing); one the viewer may
    /// neither list in its namespace nor get by name is answered as missing.
    pub(super) async fn detail(
        &self,
        caller: &Caller,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Detail, Response> {
        let who = self.who(caller).await?;
        let inv = self.cache.inventory();
        if !kind.exists(&inv, ns, name) {
            return Err(not_found(kind, ns, name));
        }
        let here = BTreeSet::from([ns.to_owned()]);
        let mut grants = self
            .read_grants(&who, &[here.clone(), here.clone(), here])
            .await?;
        if !kind.readable(&mut grants).allows(ns) {
            let by_name = match &who {
                Who::User(u) => {
                    let get = Access {
                        verb: "get",
                        resource: kind.resource(),
                        namespace: Some(ns),
                        name: Some(name),
                    };
                    self.decide(u, get).await?
                }
                Who::Anonymous => false,
            };
            if !by_name {
                return Err(not_found(kind, ns, name));
            }
            // The page shows this one object of its kind.
            let readable = kind.readable(&mut grants);
            *readable = std::mem::take(readable).with(ns);
        }
        let perms = self.permissions(&who, ns).await?;
        Ok(Detail {
            inventory: view::visible(&inv, &grants),
            who,
            perms,
        })
    }

    /// What the viewer may do in `namespace`: nothing when read-only or anonymous.
    async fn permissions(&self, who: &Who, namespace: &str) -> Result<Permissions, Response> {
        let Who::User(u) = who else {
            return Ok(Permissions::default());
        };
        if self.settings.read_only {
            return Ok(Permissions::default());
        }
        let ask = |verb, resource| Access {
            verb,
            resource,
            namespace: Some(namespace),
            name: None,
        };
        let (patch_machines, create_operations, patch_operations, delete_machines) = futures::try_join!(
            self.decide(u, ask("patch", "talosmachines")),
            self.decide(u, ask("create", "talosoperations")),
            self.decide(u, ask("patch", "talosoperations")),
            self.decide(u, ask("delete", "talosmachines")),
        )?;
        Ok(Permissions {
            patch_machines,
            create_operations,
            patch_operations,
            delete_machines,
        })
    }

    /// Whether the viewer may do `verb` on the one object `ns/name` of
    /// `kind`: false when read-only or anonymous, so no action is offered.
    pub(super) async fn may_on(
        &self,
        who: &Who,
        verb: &'static str,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<bool, Response> {
        let Who::User(u) = who else {
            return Ok(false);
        };
        if self.settings.read_only {
            return Ok(false);
        }
        let access = Access {
            verb,
            resource: kind.resource(),
            namespace: Some(ns),
            name: Some(name),
        };
        self.decide(u, access).await
    }

    pub(super) fn viewer(&self, who: &Who, reads_nothing: bool) -> Viewer {
        Viewer {
            user: match who {
                Who::User(u) => Some(u.user.username.clone()),
                Who::Anonymous => None,
            },
            read_only: self.settings.read_only,
            reads_nothing,
        }
    }
}

pub(super) fn not_found(kind: Kind, ns: &str, name: &str) -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Not found",
        &format!("There is no {} {ns}/{name} that you may read.", kind.name()),
    )
}
