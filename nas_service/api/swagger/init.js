// The service's API explorer: the OpenAPI document of this origin, rendered by the Swagger UI
// bundle served beside this file. No validator badge (it would send the document's address
// to validator.swagger.io); the token given to "Authorize" is kept only in the page's memory.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  validatorUrl: null,
  deepLinking: true,
  persistAuthorization: false,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
