[
  inputs: ["{mix,.formatter}.exs", "{config,lib,dev,test,scripts,bench}/**/*.{ex,exs}"],
  line_length: 120
]
