fn main() {
    sbx_path::cli::main()
}
