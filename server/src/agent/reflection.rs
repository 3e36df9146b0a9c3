//! gRPC server reflection (v1 and v1alpha) over the registry's published descriptors, so that
//! grpcurl and other reflective clients know the types registered at runtime as well as the
//! built-in ones (DESIGN §15): a resource's `data` (an `Any`) names its message, and the client
//! asks for that message's file. Answers follow the registry as it changes. The raft service is
//! served on the raft port only and is not advertised here.

use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};

use prost::Message as _;
use prost_reflect::{DescriptorPool, FileDescriptor};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tonic_reflection::pb::{v1, v1alpha};

use crate::registry::Registry;

/// The package of the raft service, which the API port neither serves nor advertises.
const RAFT_PACKAGE: &str = "resd.raft.v1";
/// The services the API port serves, as `ListServices` names them.
const SERVICES: [&str; 5] = [
    "resd.resource.v1.ResourceService",
    "resd.cluster.v1.ClusterService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Descriptors of the services that are not resd's own (health, reflection).
static OTHERS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut pool = DescriptorPool::new();
    for set in [
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        v1::FILE_DESCRIPTOR_SET,
        v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        // A set that does not load leaves its services unexplained, nothing else.
        let _ = pool.decode_file_descriptor_set(set);
    }
    pool
});

/// What a reflection request comes to, whichever protocol version asked.
enum Answer {
    /// Encoded `FileDescriptorProto`s: the file asked for, then what it imports.
    Files(Vec<Vec<u8>>),
    Services(Vec<String>),
    /// Extension numbers of a type: resd's messages have none.
    NoExtensions(String),
    NotFound(String),
}

/// Reflection over `registry`.
#[derive(Debug, Clone)]
pub(super) struct Reflection {
    registry: Arc<Registry>,
}

impl Reflection {
    pub(super) fn new(registry: Arc<Registry>) -> Self {
        Reflection { registry }
    }

    fn file_by_name(&self, name: &str) -> Answer {
        let pool = self.registry.descriptor_pool();
        match pool
            .get_file_by_name(name)
            .or_else(|| OTHERS.get_file_by_name(name))
        {
            Some(file) => Answer::Files(with_imports(&file)),
            None => Answer::NotFound(format!("no file {name}")),
        }
    }

    fn file_of_symbol(&self, symbol: &str) -> Answer {
        if symbol.starts_with(&format!("{RAFT_PACKAGE}.")) {
            return Answer::NotFound(format!("{symbol} is not served on this port"));
        }
        let pool = self.registry.descriptor_pool();
        match file_declaring(&pool, symbol).or_else(|| file_declaring(&OTHERS, symbol)) {
            Some(file) => Answer::Files(with_imports(&file)),
            None => Answer::NotFound(format!("no symbol {symbol}")),
        }
    }

    fn answer(&self, request: Asked) -> Answer {
        match request {
            Asked::File(name) => self.file_by_name(&name),
            Asked::Symbol(symbol) => self.file_of_symbol(&symbol),
            Asked::Extension(symbol) => Answer::NotFound(format!("{symbol} has no extensions")),
            Asked::ExtensionNumbers(symbol) => Answer::NoExtensions(symbol),
            Asked::Services => Answer::Services(SERVICES.iter().map(|s| (*s).to_owned()).collect()),
        }
    }
}

/// A reflection request, whichever protocol version asked.
enum Asked {
    File(String),
    Symbol(String),
    Extension(String),
    ExtensionNumbers(String),
    Services,
}

/// The file declaring `symbol`: a message, enum, service, or a service's method.
fn file_declaring(pool: &DescriptorPool, symbol: &str) -> Option<FileDescriptor> {
    if let Some(message) = pool.get_message_by_name(symbol) {
        return Some(message.parent_file());
    }
    if let Some(enumeration) = pool.get_enum_by_name(symbol) {
        return Some(enumeration.parent_file());
    }
    if let Some(service) = pool.get_service_by_name(symbol) {
        return Some(service.parent_file());
    }
    let (service, _method) = symbol.rsplit_once('.')?;
    pool.get_service_by_name(service)
        .map(|service| service.parent_file())
}

/// `file` and everything it imports, transitively, each encoded once; the raft file without
/// its service.
fn with_imports(file: &FileDescriptor) -> Vec<Vec<u8>> {
    let mut seen = BTreeSet::new();
    let mut pending = vec![file.clone()];
    let mut encoded = Vec::new();
    while let Some(next) = pending.pop() {
        if !seen.insert(next.name().to_owned()) {
            continue;
        }
        let mut proto = next.file_descriptor_proto().clone();
        if proto.package() == RAFT_PACKAGE {
            proto.service.clear();
        }
        encoded.push(proto.encode_to_vec());
        pending.extend(next.dependencies());
    }
    encoded
}

/// Implements one protocol version's service over [`Reflection::answer`].
macro_rules! reflection_version {
    ($version:ident) => {
        #[tonic::async_trait]
        impl $version::server_reflection_server::ServerReflection for Reflection {
            type ServerReflectionInfoStream = std::pin::Pin<
                Box<
                    dyn tokio_stream::Stream<
                            Item = Result<$version::ServerReflectionResponse, Status>,
                        > + Send,
                >,
            >;

            async fn server_reflection_info(
                &self,
                request: Request<Streaming<$version::ServerReflectionRequest>>,
            ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
                use $version::server_reflection_request::MessageRequest as In;
                use $version::server_reflection_response::MessageResponse as Out;
                let reflection = self.clone();
                let answers = request.into_inner().map(move |request| {
                    let request = request?;
                    let asked = match request.message_request.clone() {
                        Some(In::FileByFilename(name)) => Asked::File(name),
                        Some(In::FileContainingSymbol(symbol)) => Asked::Symbol(symbol),
                        Some(In::FileContainingExtension(extension)) => {
                            Asked::Extension(extension.containing_type)
                        }
                        Some(In::AllExtensionNumbersOfType(symbol)) => {
                            Asked::ExtensionNumbers(symbol)
                        }
                        Some(In::ListServices(_)) => Asked::Services,
                        None => {
                            return Err(Status::invalid_argument(
                                "a reflection request must ask for something",
                            ));
                        }
                    };
                    let response = match reflection.answer(asked) {
                        Answer::Files(files) => {
                            Out::FileDescriptorResponse($version::FileDescriptorResponse {
                                file_descriptor_proto: files,
                            })
                        }
                        Answer::Services(names) => {
                            Out::ListServicesResponse($version::ListServiceResponse {
                                service: names
                                    .into_iter()
                                    .map(|name| $version::ServiceResponse { name })
                                    .collect(),
                            })
                        }
                        Answer::NoExtensions(base_type_name) => {
                            Out::AllExtensionNumbersResponse($version::ExtensionNumberResponse {
                                base_type_name,
                                extension_number: Vec::new(),
                            })
                        }
                        Answer::NotFound(message) => Out::ErrorResponse($version::ErrorResponse {
                            error_code: tonic::Code::NotFound as i32,
                            error_message: message,
                        }),
                    };
                    Ok($version::ServerReflectionResponse {
                        valid_host: request.host.clone(),
                        original_request: Some(request),
                        message_response: Some(response),
                    })
                });
                Ok(Response::new(Box::pin(answers)))
            }
        }
    };
}

reflection_version!(v1);
reflection_version!(v1alpha);

/// The v1 service.
pub(super) fn v1_service(
    reflection: Reflection,
) -> v1::server_reflection_server::ServerReflectionServer<Reflection> {
    v1::server_reflection_server::ServerReflectionServer::new(reflection)
}

/// The v1alpha service (grpcurl before 1.9 asks it).
pub(super) fn v1alpha_service(
    reflection: Reflection,
) -> v1alpha::server_reflection_server::ServerReflectionServer<Reflection> {
    v1alpha::server_reflection_server::ServerReflectionServer::new(reflection)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(answer: Answer) -> Vec<prost_types::FileDescriptorProto> {
        match answer {
            Answer::Files(files) => files
                .iter()
                .map(|bytes| {
                    prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("a file")
                })
                .collect(),
            _ => panic!("expected files"),
        }
    }

    #[test]
    fn registered_types_are_reflected_and_raft_is_not() {
        let registry = Arc::new(Registry::builtin().expect("registry"));
        let reflection = Reflection::new(registry.clone());
        assert!(matches!(
            reflection.answer(Asked::Symbol("resd.payments.v1.Invoice".into())),
            Answer::NotFound(_)
        ));
        let stored =
            crate::registry::dynamic::compile(&crate::registry::dynamic::tests::invoice_type())
                .expect("compiles");
        registry
            .dynamic()
            .install_stored(&crate::registry::dynamic::tests::stored(
                "payments-invoice",
                "7",
                "01A",
                &stored,
            ));
        let found = files(reflection.answer(Asked::Symbol("resd.payments.v1.Invoice".into())));
        assert_eq!(found[0].name(), "resd/payments/v1/Invoice.proto");
        assert!(
            found
                .iter()
                .any(|f| f.name() == "google/protobuf/timestamp.proto"),
            "its imports come along"
        );
        let method = files(reflection.answer(Asked::Symbol(
            "resd.resource.v1.ResourceService.Write".into(),
        )));
        assert!(
            method[0]
                .service
                .iter()
                .any(|s| s.name() == "ResourceService")
        );
        assert!(matches!(
            reflection.answer(Asked::Symbol("resd.raft.v1.RaftService".into())),
            Answer::NotFound(_)
        ));
        let health = files(reflection.answer(Asked::Symbol("grpc.health.v1.Health".into())));
        assert_eq!(health[0].package(), "grpc.health.v1");
        match reflection.answer(Asked::Services) {
            Answer::Services(names) => assert!(!names.iter().any(|n| n.contains("raft"))),
            _ => panic!("services"),
        }
    }
}
